"""server_view: what this server's browser may see. Pure."""

from jupyterlab_gpumem.view import server_view

GiB = 1 << 30


def history(**over):
    h = {
        "now": 100,
        "step_seconds": 1,
        "alert_threshold": 0.8,
        "report": {
            "gpus": [
                {
                    "index": 0,
                    "memory_total_bytes": 80 * GiB,
                    "memory_used_bytes": 9 * GiB,
                    "holders": [{"kind": "process", "name": "pid 9 (bob)", "command": "secret --token x"}],
                }
            ],
            "notebooks": [
                {
                    "kernel_id": "mine",
                    "notebook": "/r/a.ipynb",
                    "user": "ann",
                    "gpu_memory_bytes": 2 * GiB,
                    "per_gpu": [{"index": 0, "bytes": 2 * GiB}],
                },
                {
                    "kernel_id": "other-server",
                    "notebook": "/r/b.ipynb",
                    "user": "ann",
                    "gpu_memory_bytes": 3 * GiB,
                    "per_gpu": [{"index": 0, "bytes": 3 * GiB}],
                },
            ],
            "other": [{"pid": 9, "user": "bob", "command": "secret --token x", "per_gpu": [{"index": 0, "bytes": GiB}]}],
        },
        "gpus": [{"id": "0", "points": [[100, 9 * GiB]]}],
        "notebooks": [{"id": "mine", "points": [[100, 2 * GiB]]}, {"id": "other-server", "points": [[100, 3 * GiB]]}],
        "events": [{"seq": 1, "kernel_id": "other-server"}, {"seq": 2, "kernel_id": "mine"}],
        "last_event": 2,
        # What the daemon totals beyond kernels=mine.
        "others": [
            {
                "user": "ann",
                "notebooks": 1,
                "other_processes": 0,
                "gpu_memory_bytes": 3 * GiB,
                "per_gpu": [{"index": 0, "bytes": 3 * GiB}],
            },
            {
                "user": "bob",
                "notebooks": 0,
                "other_processes": 1,
                "gpu_memory_bytes": GiB,
                "per_gpu": [{"index": 0, "bytes": GiB}],
            },
        ],
    }
    h.update(over)
    return h


def test_own_kernels_in_full_others_as_totals():
    v = server_view(history(), {"mine"}, {"mine": "a.ipynb"})
    assert [nb["kernel_id"] for nb in v["notebooks"]] == ["mine"]
    assert v["notebooks"][0]["path"] == "a.ipynb"
    assert v["others"] == history()["others"]  # the daemon's totals, as they came
    assert "holders" not in v["gpus"][0]
    assert [s["id"] for s in v["series"]["notebooks"]] == ["mine"]
    assert [e["seq"] for e in v["events"]] == [2]
    text = str(v)
    assert "other-server" not in text and "secret" not in text and "/r/b.ipynb" not in text


def test_alerts_of_this_server():
    alerts = [
        {"id": "gpu0-1", "kind": "threshold", "gpu": 0, "kernels": ["mine", "other-server"], "message": "GPU 0 is 90% full"},
        {"id": "cull-mine-1", "kind": "cull", "gpu": -1, "kernels": ["mine"], "message": "will be shut down"},
        {"id": "cull-other-server-1", "kind": "cull", "gpu": -1, "kernels": ["other-server"], "message": "not ours"},
        {"id": "left-4-1", "kind": "left_running", "gpu": 0, "kernels": ["gone"], "message": "left running"},
    ]
    h = history()
    h["report"]["alerts"] = alerts
    v = server_view(h, {"mine"}, {}, known_kernels={"mine", "gone"})
    assert [(a["id"], a["kernels"]) for a in v["alerts"]] == [("gpu0-1", ["mine"]), ("cull-mine-1", ["mine"]), ("left-4-1", [])]
    assert "not ours" not in str(v)


def test_empty_history():
    v = server_view({}, set(), {})
    assert v["status"] == "ok" and v["notebooks"] == [] and v["others"] == [] and v["gpus"] == [] and v["alerts"] == []


def test_gpu_work_series_and_processes_left_running():
    lr = [
        {"kernel_id": "mine", "pid": 42, "message": "a job started from a.ipynb … left running"},
        {"kernel_id": "shut-down-here", "pid": 43, "message": "…"},
        {"kernel_id": "other-server", "pid": 44, "message": "secret job"},
    ]
    h = history(
        notebook_sm=[{"id": "mine", "points": [[100, 97]]}, {"id": "other-server", "points": [[100, 5]]}],
        events=[
            {"seq": 1, "kernel_id": "other-server", "kind": "left_running"},
            {"seq": 2, "kernel_id": "shut-down-here", "kind": "left_running"},
            {"seq": 3, "kernel_id": "shut-down-here", "kind": "reclaim"},
        ],
    )
    h["report"]["left_running"] = lr
    v = server_view(h, {"mine"}, {}, known_kernels={"mine", "shut-down-here"})
    assert [s["id"] for s in v["series"]["notebook_sm"]] == ["mine"]
    # A kernel this server ran and shut down: its jobs left running are
    # still this server's to hear about and end; nothing else of it is.
    assert [e["seq"] for e in v["events"]] == [2]
    assert [x["pid"] for x in v["left_running"]] == [42, 43]
    assert "secret job" not in str(v)

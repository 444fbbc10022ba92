"""server_view: what this server's browser may see. Pure."""

from jupyterlab_gpumem.view import server_view

GiB = 1 << 30


def history(**over):
    h = {
        "now": 100,
        "step_seconds": 1,
        "alert_threshold": 0.8,
        "report": {
            "gpus": [{"index": 0, "memory_total_bytes": 80 * GiB, "memory_used_bytes": 9 * GiB}],
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
    }
    h.update(over)
    return h


def test_own_kernels_in_full_others_as_totals():
    v = server_view(history(), {"mine"}, {"mine": "a.ipynb"})
    assert [nb["kernel_id"] for nb in v["notebooks"]] == ["mine"]
    assert v["notebooks"][0]["path"] == "a.ipynb"
    assert v["others"] == [
        {"user": "ann", "notebooks": 1, "processes": 0, "bytes": 3 * GiB, "per_gpu": [{"index": 0, "bytes": 3 * GiB}]},
        {"user": "bob", "notebooks": 0, "processes": 1, "bytes": GiB, "per_gpu": [{"index": 0, "bytes": GiB}]},
    ]
    assert [s["id"] for s in v["series"]["notebooks"]] == ["mine"]
    assert [e["seq"] for e in v["events"]] == [2]
    text = str(v)
    assert "other-server" not in text and "secret" not in text and "/r/b.ipynb" not in text


def test_shared_mode_users_totals():
    h = history(
        users=[
            {
                "user": "carol",
                "notebooks": 2,
                "other_processes": 1,
                "gpu_memory_bytes": 5 * GiB,
                "per_gpu": [{"index": 0, "bytes": 5 * GiB}],
            }
        ]
    )
    v = server_view(h, {"mine"}, {})
    assert v["others"][0]["user"] == "carol" and v["others"][0]["bytes"] == 5 * GiB
    assert v["others"][0]["notebooks"] == 2 and v["others"][0]["processes"] == 1


def test_empty_history():
    v = server_view({}, set(), {})
    assert v["status"] == "ok" and v["notebooks"] == [] and v["others"] == [] and v["gpus"] == []

"""The golden report Go writes (testdata/report, TestGoldenReport) as the
server extension filters gpumem serve's (view.py): a server's own kernels
in full, the GPUs without their holders, the alerts that concern it. A
field renamed in Go fails here. Pure."""

import json
import os

from jupyterlab_gpumem.view import server_view

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = "4c1f2e0a-6b7d-4e21-9a3c-1d2e3f405162"
EVAL = "9d00be11-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
BOB = "b0b0b0b0-1111-4222-8333-444455556666"

with open(os.path.join(REPO, "testdata", "report", "golden-report.json")) as f:
    GOLDEN = json.load(f)


def view(own, known=()):
    history = {"now": 1772460000, "step_seconds": 1, "alert_threshold": 0.8, "report": GOLDEN, "last_event": 41}
    return server_view(history, set(own), {k: "nb/%s.ipynb" % k[:4] for k in own}, set(known))


def test_schema():
    assert GOLDEN["schema"] == 1


def test_alices_server():
    st = view({TRAIN, EVAL})
    assert [nb["kernel_id"] for nb in st["notebooks"]] == [TRAIN, EVAL]
    assert [nb["path"] for nb in st["notebooks"]] == ["nb/4c1f.ipynb", "nb/9d00.ipynb"]
    # Each notebook as the daemon wrote it, its path added.
    train = next(nb for nb in GOLDEN["notebooks"] if nb["kernel_id"] == TRAIN)
    assert {k: v for k, v in st["notebooks"][0].items() if k != "path"} == train
    for key in ("activity", "stray_contexts", "compute", "pod", "peak_bytes", "utilization"):
        assert key in st["notebooks"][0], key
    assert "oom" in st["notebooks"][1]
    # Who holds each GPU names other servers' notebooks: never passed on,
    # whatever the daemon calls it.
    assert [g["index"] for g in st["gpus"]] == [0, 1]
    assert all("holders" not in g and "holders_by_user" not in g for g in st["gpus"])
    assert "/home/bob" not in json.dumps(st["gpus"]) and "serve.py" not in json.dumps(st["gpus"])
    assert st["gpus"][0]["memory_used_bytes"] == GOLDEN["gpus"][0]["memory_used_bytes"]
    assert st["warnings"] == GOLDEN["warnings"]
    kinds = {a["kind"]: a for a in st["alerts"]}
    assert set(kinds) == {"threshold", "cull", "left_running", "oom"}
    assert sorted(kinds["threshold"]["kernels"]) == [TRAIN]  # bob's and dave's kernels are not this server's
    assert kinds["cull"]["kernels"] == [TRAIN] and "idle 3 h 5 min" in kinds["cull"]["message"]
    assert kinds["oom"]["kernels"] == [EVAL]
    assert [lr["pid"] for lr in st["left_running"]] == [777]


def test_bobs_server():
    st = view({BOB})
    assert [nb["user"] for nb in st["notebooks"]] == ["bob"]
    assert [a["kind"] for a in st["alerts"]] == ["threshold"]
    assert st["alerts"][0]["kernels"] == [BOB]
    assert st["left_running"] == []


def test_a_users_own_view():
    # A shared daemon serves a user's server their own view (sidecar/api's TestGoldenOwnView).
    with open(os.path.join(REPO, "testdata", "report", "golden-report-own.json")) as f:
        own = json.load(f)
    assert own["schema"] == 1 and own["view"] == "own"
    history = {"now": 1772460000, "report": own}
    st = server_view(history, {TRAIN, EVAL}, {})
    assert [nb["kernel_id"] for nb in st["notebooks"]] == [TRAIN, EVAL]
    assert "/home/bob" not in json.dumps(st["gpus"])


def test_a_kernel_it_ran_earlier():
    # train.ipynb's kernel was this server's: the process left running is still its to end.
    st = view(set(), known={TRAIN})
    assert [a["kind"] for a in st["alerts"]] == ["threshold", "left_running"]
    assert [lr["kernel_id"] for lr in st["left_running"]] == [TRAIN]

"""The golden report Go writes (testdata/report, TestGoldenReport) read
as the magics read gpumem serve's: %gpumem top's holders, a notebook's
driver figures, and the out-of-memory report. A field renamed in Go fails
here."""

import json
import os

from gpumem_magics import daemon, render, render_oom

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TRAIN = "4c1f2e0a-6b7d-4e21-9a3c-1d2e3f405162"
EVAL = "9d00be11-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def golden(name):
    with open(os.path.join(REPO, "testdata", "report", name)) as f:
        return json.load(f)


def test_schema():
    assert golden("golden-report.json")["schema"] == 1


def test_top():
    data = daemon.top_view(golden("golden-report.json"), {0, 1}, TRAIN)
    text, html = render.render(data)
    lines = text.splitlines()
    assert "GPU 0  NVIDIA H200  70.0 GiB / 80.0 GiB used (88%)" in lines, text
    assert "GPU 1  NVIDIA H200  12.5 GiB / 80.0 GiB used (16%)" in lines, text
    rows = [line.split() for line in lines if line.startswith("  ")]
    assert ["train.ipynb", "alice", "40.5", "GiB", "<-", "this", "kernel"] in rows, text
    assert ["finetune.ipynb", "bob", "16.0", "GiB"] in rows, text
    assert ["pid", "400", "(carol):", "python3", "serve.py", "--port", "8000", "carol", "8.0", "GiB"] in rows, text
    assert ["kernel", "da7eda7e", "dave", "4.0", "GiB"] in rows, text
    assert ["eval.ipynb", "alice", "12.0", "GiB"] in rows, text
    assert "this kernel" in html and not data["note"]


def test_top_in_shared_mode():
    # Alice's own view (sidecar/api's TestGoldenOwnView): every other user is one holder.
    data = daemon.top_view(golden("golden-report-own.json"), {0}, TRAIN)
    text, _html = render.render(data)
    assert data["note"] and data["note"] in text
    names = [h["name"] for h in data["gpus"][0]["holders"]]
    want = ["train.ipynb", "user bob (1 notebook)", "user carol (0 notebooks)", "user dave (1 notebook)"]
    assert names == want, names


def test_top_of_the_gpus_used():
    data = daemon.top_view(golden("golden-report.json"), {1}, EVAL)
    assert [g["index"] for g in data["gpus"]] == [1]
    assert [(h["name"], h["self"]) for h in data["gpus"][0]["holders"]] == [
        ("eval.ipynb", True),
        ("finetune.ipynb", False),
    ]


def test_notebook_usage():
    rep = golden("golden-report.json")
    bob = next(nb for nb in rep["notebooks"] if nb["user"] == "bob")
    u = daemon.notebook_usage(bob)
    assert u["bytes"] == (16 << 30) + (518 << 20) and u["pids"] == [300]
    assert [g["index"] for g in u["per_gpu"]] == [0, 1]
    assert [s["cause"] for s in u["stray_contexts"]] == ["default_device"]
    assert u["utilization"] is None  # GPU 1 cannot say: unknown, never 0
    assert u["compute"]["state"] == "computing"


def test_oom_report():
    ev = golden("golden-oom.json")
    req = {k: ev[k] for k in ("requested_bytes", "error", "cell", "kernel")}
    req["device"] = {"ordinal": 0}
    text, _html = render_oom.render_oom({"kind": "oom", "label": "PyTorch", "request": req, "event": ev})
    lines = [line.strip() for line in text.splitlines()]
    assert "asked for 20.0 GiB on cuda:0 (torch.OutOfMemoryError)" in lines, text
    assert "9.0 GiB allocated by PyTorch; cached 2.0 GiB (releasable 1.0 GiB, fragmented 1.0 GiB)" in lines, text
    assert "GPU 1 (NVIDIA H200): 80.0 GiB total, 12.5 GiB used, 67.5 GiB free" in lines, text
    rows = [line.split() for line in lines]
    assert ["this", "kernel", "alice", "12.0", "GiB", "idle", "1", "min", "30", "s", "200"] in rows, text
    assert ["finetune.ipynb", "bob", "518.0", "MiB", "busy", "300"] in rows, text
    assert "advice: " + ev["advice"] in lines, text


def test_oom_report_own_view():
    # Alice's view of it from a shared daemon (sidecar/oom's TestGoldenOwnView): bob is one holder, his total.
    ev = golden("golden-oom-own.json")
    req = {k: ev[k] for k in ("requested_bytes", "error", "cell", "kernel")}
    text, html = render_oom.render_oom({"kind": "oom", "label": "PyTorch", "request": req, "event": ev})
    rows = [line.split() for line in text.splitlines()]
    assert ["this", "kernel", "alice", "12.0", "GiB", "idle", "1", "min", "30", "s", "200"] in rows, text
    assert ["user", "bob", "bob", "518.0", "MiB"] in rows, text
    assert "gpumem serve runs in shared mode: other users are shown as one holder each, their total." in text, text
    for leak in ("finetune", "b0b0b0b0", "kernel-c.json", "300"):
        assert leak not in text and leak not in html, leak

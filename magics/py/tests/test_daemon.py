"""The magics without gpumem serve: one clear sentence, the panel's."""

import importlib
import os
import socket
import sys

from gpumem_magics import daemon, state

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def panel_sentence(sock):
    # The server extension's module, in its package (it imports the
    # package's units); the package's __init__ imports nothing of Jupyter's.
    sys.path.insert(0, os.path.join(REPO, "labextension"))
    try:
        supervision = importlib.import_module("jupyterlab_gpumem.supervision")
    finally:
        sys.path.pop(0)
    status = supervision.describe(supervision.NOT_RUNNING, reason=supervision.reason_nothing_listens(sock))
    return status["text"]


def with_socket(monkeypatch, sock):
    monkeypatch.setitem(state.config, "sidecar_socket", sock)


def test_no_socket_file(tmp_path, monkeypatch):
    sock = str(tmp_path / "gpumem.sock")
    with_socket(monkeypatch, sock)
    want = panel_sentence(sock)
    assert daemon.driver_usage() == {"error": want}
    assert daemon.top_data() == {"kind": "top", "error": want}
    assert "OSError" not in want and "Errno" not in want


def test_every_request_says_the_one_sentence(tmp_path, monkeypatch):
    # %gpumem why's join, free --children, the out-of-memory report and a
    # snapshot's hand-over: no "answered -1" for a daemon nobody serves.
    sock = str(tmp_path / "gpumem.sock")
    with_socket(monkeypatch, sock)
    monkeypatch.setitem(state.config, "kernel_id", "4c1f2e0a-aaaa")
    want = panel_sentence(sock)
    assert daemon.free_children() == {"error": want}
    assert daemon.children_before() == (None, want)
    assert daemon.why_join({"rows": []})["driver"] == {"error": want}
    status, reply = daemon.sidecar_post("/api/v1/oom", {}, 1)
    assert daemon.request_error(status, reply) == want


def test_socket_nobody_listens_on(tmp_path, monkeypatch):
    sock = str(tmp_path / "gpumem.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock)  # bound, never listening: what a daemon that died leaves
    try:
        with_socket(monkeypatch, sock)
        assert daemon.driver_usage() == {"error": panel_sentence(sock)}
    finally:
        s.close()


def test_other_failures_keep_their_reason(tmp_path, monkeypatch):
    # A socket that accepts and never answers is not "not running".
    sock = str(tmp_path / "gpumem.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sock)
    s.listen(1)
    try:
        with_socket(monkeypatch, sock)
        got = daemon.driver_usage(timeout=0.2)
        assert got["error"].startswith("gpumem serve did not answer on " + sock), got
    finally:
        s.close()


def test_top_renders_the_daemons_holders(tmp_path, monkeypatch):
    # Who holds each GPU is gpumem serve's, ranked and named: top keeps the
    # GPUs this kernel uses and renders their holders as they came.
    import json

    with_socket(monkeypatch, str(tmp_path / "gpumem.sock"))
    monkeypatch.setitem(state.config, "kernel_id", "k-mine")
    monkeypatch.setattr(daemon, "driver_usage", lambda timeout=0.5, fresh=False: {"per_gpu": [{"index": 1, "bytes": 5}]})
    report = {
        "view": "own",
        "gpus": [
            {"index": 0, "name": "A", "holders": [{"kind": "notebook", "name": "/elsewhere.ipynb", "bytes": 9}]},
            {
                "index": 1,
                "name": "B",
                "memory_used_bytes": 30,
                "memory_total_bytes": 80,
                "holders": [
                    {"kind": "user", "name": "user bob", "user": "bob", "bytes": 20, "notebooks": 3},
                    {"kind": "notebook", "name": "/home/ann/a.ipynb", "user": "ann", "bytes": 5, "kernel_id": "k-mine"},
                    {"kind": "process", "name": "pid 7 (ann)", "user": "ann", "bytes": 4, "pid": 7, "command": "/bin/sleep 600"},
                    {"kind": "user", "name": "user cy", "user": "cy", "bytes": 1, "notebooks": 1},
                ],
            },
        ],
    }
    monkeypatch.setattr(daemon, "sidecar_get", lambda path, timeout: (200, json.dumps(report).encode()))
    top = daemon.top_data()
    assert [g["index"] for g in top["gpus"]] == [1]
    assert top["gpus"][0]["holders"] == [
        {"name": "user bob (3 notebooks)", "user": "bob", "bytes": 20},
        {"name": "/home/ann/a.ipynb", "user": "ann", "bytes": 5, "self": True},
        {"name": "pid 7 (ann): /bin/sleep 600", "user": "ann", "bytes": 4},
        {"name": "user cy (1 notebook)", "user": "cy", "bytes": 1},
    ]
    assert "shared mode" in top["note"]


def no_driver_warning():
    # The daemon's own words (nvml.NoDriverWarning): the magics repeat them.
    import re

    with open(os.path.join(REPO, "nvml", "source.go")) as f:
        return re.search(r'const NoDriverWarning = "([^"]+)"', f.read()).group(1)


def fake_daemon(monkeypatch, tmp_path, report, notebook):
    import json

    with_socket(monkeypatch, str(tmp_path / "gpumem.sock"))
    monkeypatch.setitem(state.config, "kernel_id", "k-mine")

    def get(path, timeout):
        if path.startswith("/api/v1/kernels/k-mine"):
            return 200, json.dumps(notebook).encode()
        if path == "/api/v1/notebooks":
            return 200, json.dumps(report).encode()
        return 404, b'{"error": "no such route"}'

    monkeypatch.setattr(daemon, "sidecar_get", get)


def test_no_driver_said_in_the_daemons_words(tmp_path, monkeypatch):
    # Without a driver the daemon reports no GPU and says why: %gpumem and
    # %gpumem top say that sentence, never "0 B" nor a MIG guess.
    from gpumem_magics import render

    why = no_driver_warning()
    nb = {"kernel_id": "k-mine", "gpu_memory_bytes": 0, "per_gpu": [], "pids": [os.getpid()]}
    fake_daemon(monkeypatch, tmp_path, {"gpus": [], "notebooks": [nb], "warnings": [why]}, nb)
    drv = daemon.driver_usage()
    assert drv["no_gpu"].startswith(why) and "nvidia-smi" in drv["no_gpu"], drv
    text, html = render.render({"kind": "summary", "pid": 1, "frameworks": [], "driver": drv, "advice": None})
    assert "GPU n/a: " + why in text and why in html, text
    assert "0 B" not in text and "MIG" not in text, text
    top = daemon.top_data()
    text, html = render.render(top)
    assert "GPU n/a: " + why in text and why in html, text


def test_no_gpu_without_the_daemons_reason(tmp_path, monkeypatch):
    # A shared daemon shows a user no warnings: the panel's words then.
    nb = {"kernel_id": "k-mine", "gpu_memory_bytes": 0, "per_gpu": [], "pids": [1]}
    fake_daemon(monkeypatch, tmp_path, {"gpus": [], "notebooks": [nb], "view": "own"}, nb)
    assert daemon.driver_usage()["no_gpu"].startswith("gpumem serve sees no GPU on this machine")


def test_simulated_gpus_said(tmp_path, monkeypatch):
    from gpumem_magics import render

    nb = {"kernel_id": "k-mine", "gpu_memory_bytes": 0, "per_gpu": [], "pids": [1]}
    gpu = {"index": 0, "name": "Simulated H100", "simulated": True, "memory_used_bytes": 5, "memory_total_bytes": 80}
    fake_daemon(monkeypatch, tmp_path, {"gpus": [gpu], "notebooks": [nb]}, nb)
    drv = daemon.driver_usage()
    assert drv["simulated"] == daemon.SIMULATED and "no_gpu" not in drv, drv
    text, _ = render.render({"kind": "summary", "pid": 1, "frameworks": [], "driver": drv, "advice": None})
    assert daemon.SIMULATED in text and "0 B for this kernel" in text, text
    top = daemon.top_view({"gpus": [gpu]}, {0}, "k-mine")
    assert daemon.SIMULATED in render.render(top)[0]


def test_real_gpus_no_note_one_request(tmp_path, monkeypatch):
    # A kernel with figures asks for its own only (the one request a
    # kernel makes in shared mode); one without asks for the report too.
    nb = {"kernel_id": "k-mine", "gpu_memory_bytes": 5, "per_gpu": [{"index": 0, "bytes": 5}], "pids": [1]}
    gpu = {"index": 0, "name": "NVIDIA H200", "memory_used_bytes": 5, "memory_total_bytes": 80}
    fake_daemon(monkeypatch, tmp_path, {"gpus": [gpu], "notebooks": [nb]}, nb)
    asked = []
    get = daemon.sidecar_get
    monkeypatch.setattr(daemon, "sidecar_get", lambda path, timeout: asked.append(path) or get(path, timeout))
    drv = daemon.driver_usage()
    assert "no_gpu" not in drv and "simulated" not in drv, drv
    assert asked == ["/api/v1/kernels/k-mine"], asked
    assert daemon.gpu_note({"gpus": [gpu]}) == {}
    nb.update(gpu_memory_bytes=0, per_gpu=[])
    asked.clear()
    assert "no_gpu" not in daemon.driver_usage()
    assert asked == ["/api/v1/kernels/k-mine", "/api/v1/notebooks"], asked

"""The magics without gpumem serve: one clear sentence, the panel's."""

import importlib.util
import os
import socket

from gpumem_magics import daemon, state

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def panel_sentence(sock):
    spec = importlib.util.spec_from_file_location(
        "gpumem_supervision", os.path.join(REPO, "labextension", "jupyterlab_gpumem", "supervision.py")
    )
    supervision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(supervision)
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

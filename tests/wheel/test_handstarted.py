"""A daemon started by hand before JupyterLab: the server uses it, starts
no second one, and leaves it running when it stops."""

import os
import signal
import time

from conftest import alive, daemons, wait_case
from harness import wait_for


def test_a_running_daemon_is_used_not_doubled_not_stopped(wstack):
    wstack.start_daemon()
    hand = wstack.daemon.p.pid
    lab = wstack.server(autostart=True)
    st = wait_case(lab, "shared")
    assert st["pid"] == hand, st
    # Several checks later (one a second) there is still one daemon.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert daemons(wstack.socket) == [hand], "a second daemon for the same runtime dir"
        time.sleep(0.2)  # sampling the process list over a window, not waiting for a state
    assert not (wstack.runtime / "gpumem-serve.log").exists(), "the server started a daemon of its own"

    os.kill(lab.proc.p.pid, signal.SIGTERM)
    wait_for("the server to exit", lambda: lab.proc.p.poll() is not None, timeout=60)
    # Left running, and still answering.
    assert alive(hand)
    assert wstack.daemon_get("/healthz").status_code == 200
    assert daemons(wstack.socket) == [hand]

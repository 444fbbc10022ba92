"""Two JupyterLab servers of one user, one runtime dir: one daemon, started
by the first and shared by the second. When the first server stops, its
daemon leaves with it and the second starts a new one within 10 s of the
old one going; the second's figures go on."""

import os
import signal
import time

from conftest import alive, daemons, wait_case, wait_started
from harness import GiB, wait_for


def test_two_servers_share_one_daemon_and_the_survivor_restarts_it(wstack):
    first = wstack.server(autostart=True)
    old = wait_started(first)["pid"]
    second = wstack.server(autostart=True)
    shared = wait_case(second, "shared")
    assert shared["pid"] == old, shared
    assert shared["user"] and f"pid {old}, user {shared['user']}" in shared["text"], shared
    assert daemons(wstack.socket) == [old], "one daemon for the runtime dir"

    second.notebook("b.ipynb", ["x = 1"])
    kernel = second.start_session("b.ipynb")
    pid = wstack.kernel_pid(kernel)
    wstack.set_gpu({pid: 5 * GiB})

    def figure(lab, want):
        st = lab.state()
        nbs = st.get("notebooks") or []
        return st.get("status") == "ok" and nbs and nbs[0]["kernel_id"] == kernel and nbs[0]["gpu_memory_bytes"] == want

    wait_for("the second server's figure through the shared daemon", lambda: figure(second, 5 * GiB), timeout=10)

    os.kill(first.proc.p.pid, signal.SIGTERM)
    wait_for("the first server to exit", lambda: first.proc.p.poll() is not None, timeout=60)
    wait_for("the first server's daemon to leave", lambda: not alive(old), timeout=30)
    gone = time.monotonic()
    new = wait_started(second, timeout=10)["pid"]
    took = time.monotonic() - gone
    print(f"the second server's daemon served {took:.1f} s after the first's left")
    assert new != old and took <= 10
    assert daemons(wstack.socket) == [new]
    # Its kernel was not touched by the change of daemon, and its figures go on.
    assert alive(pid)
    wstack.set_gpu({pid: 6 * GiB})
    wait_for("the second server's figure from the new daemon", lambda: figure(second, 6 * GiB), timeout=15)
    assert "gpumem serve (pid %d) that served" % old in open(second.proc.log).read()

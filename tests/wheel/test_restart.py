"""The daemon a server started crashes (SIGKILL): the server starts it
again with backoff (1 s, then 2 s) and logs one line each time."""

import os
import re
import signal
import time

from conftest import alive, daemons, server_log, wait_case, wait_started
from harness import wait_for


def test_a_crashed_daemon_is_restarted_with_backoff_one_line_each(wstack):
    lab = wstack.server(autostart=True)
    first = wait_started(lab)["pid"]
    pids, gaps = [first], []
    for _ in range(2):
        os.kill(pids[-1], signal.SIGKILL)
        killed = time.monotonic()
        wait_for("the daemon to die", lambda: not alive(pids[-1]), timeout=10)
        new = wait_case(lab, "started", timeout=15, unless_pid=pids[-1])["pid"]
        gaps.append(time.monotonic() - killed)
        pids.append(new)
    lines = [ln for ln in server_log(lab).splitlines() if "exited with signal 9" in ln]
    assert len(lines) == 2, lines
    for pid, wait, line in zip(pids, (1, 2), lines):
        assert re.search(rf"gpumem serve \(pid {pid}\) exited with signal 9 after \d+ s.*starting it again in {wait} s", line), (
            line
        )
    assert gaps[1] >= 2, f"the second restart came {gaps[1]:.1f} s after the crash: no backoff"
    assert daemons(wstack.socket) == [pids[-1]]

"""No gpumem process outlives its server: stopped with SIGTERM, with
Ctrl-C (SIGINT twice to its process group, as a terminal sends it) or with
SIGKILL, the server's daemon still ends the orphan its kernel left (a worker
in a session of its own, holding GPU memory), then exits."""

import os
import signal
import time
from pathlib import Path

import pytest
from conftest import alive, daemons, wait_started
from harness import GiB, wait_for
from jupyter_client import BlockingKernelClient

WORKER = """import subprocess
w = subprocess.Popen(["sleep", "600"], start_new_session=True)
print(w.pid)"""


def run_cell(connection_file, code):
    kc = BlockingKernelClient(connection_file=str(connection_file))
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        out = []
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)
    finally:
        kc.stop_channels()


def stop(lab, how):
    pid = lab.proc.p.pid
    if how == "SIGTERM":
        os.kill(pid, signal.SIGTERM)
    elif how == "SIGKILL":
        os.kill(pid, signal.SIGKILL)
    else:  # Ctrl-C twice: the second within jupyter's 5 s confirmation skips it
        os.killpg(pid, signal.SIGINT)
        time.sleep(0.5)  # the gap between two key presses, not a wait for a state
        os.killpg(pid, signal.SIGINT)


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C", "SIGKILL"])
def test_daemon_reclaims_then_leaves_with_its_server(wstack, how):
    lab = wstack.server(autostart=True)
    daemon = wait_started(lab)["pid"]
    lab.notebook("train.ipynb", ["x = 1"])
    kernel = lab.start_session("train.ipynb")
    kpid = wstack.kernel_pid(kernel)
    worker = int(run_cell(wstack.runtime / f"kernel-{kernel}.json", WORKER).split()[-1])
    try:
        wstack.set_gpu({kpid: 1 * GiB, worker: 2 * GiB})

        def worker_counted():
            for nb in wstack.daemon_get("/api/v1/notebooks").json().get("notebooks") or []:
                if nb.get("kernel_id") == kernel and worker in nb.get("pids", []):
                    return True

        wait_for("the daemon to count the worker in the notebook", worker_counted, timeout=20)

        stopped = time.monotonic()
        stop(lab, how)
        wait_for("the server to exit", lambda: lab.proc.p.poll() is not None, timeout=60)
        wait_for("the kernel to exit", lambda: not alive(kpid), timeout=30)
        wait_for("the daemon to end the orphan", lambda: not alive(worker), timeout=30)
        wait_for("no gpumem process left", lambda: daemons(wstack.socket) == [], timeout=30)
        print(f"{how}: no gpumem process {time.monotonic() - stopped:.1f} s after the stop")
        assert not alive(daemon)
        log = (wstack.runtime / "gpumem-serve.log").read_text(errors="replace")
        assert "the process that started this daemon exited" in log, log[-3000:]
        assert "orphan ended" in log and f"pid={worker}" in log, log[-3000:]
        assert not Path(wstack.socket).exists(), "the daemon left its socket behind"
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)

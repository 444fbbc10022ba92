#!/usr/bin/env python3
"""arbiter_check.py: the hub's arbiter (jupyterlab_gpumem.hub.GPUArbiter)
against the root daemon while a real training loop computes on the GPU,
and once it stops.

Runs ON the GPU host as root, in gpu_host_current.sh's environment (its
Jupyter stack with jupyterhub-idle-culler 2 and httpx; GPUMEM_BIN,
GPUKIT_PYTHON, JUPYTER_RUNTIME_DIR set), from the checkout's root:

  GPUMEM_CURRENT_STEPS=arbiter bash scripts/gpuhost/gpu_host_current.sh

  1. a Jupyter server, `gpumem serve --all-users --socket-mode shared` (the
     hub's root daemon, judging GPU work over a 10 s window), and a kernel
     of notebook train.ipynb whose cell starts a training loop in a thread
     and returns: the kernel is idle, its process computes on the GPU (a
     browser tab closed on a run);
  2. the arbiter, called as jupyterhub-idle-culler 2 calls its
     cull_arbiter_hook for the user's server after 3 h of inactivity
     (limit 1 h): it vetoes, naming the GPU work; so does one with the
     GPU-idle rule on;
  3. the loop stopped (its tensors still held): the culler's clock
     (jupyterhub_idle_culler.utcnow, patched as the culler's own tests
     travel in time) 2 h on, the arbiter allows the culler's rule; with the
     GPU-idle rule on, a server used 10 min ago (a keep-alive) that holds
     GPU memory and computed nothing for 2 h is culled;
  4. the daemon stopped: the arbiter vetoes, saying it cannot ask.

Prints each decision's log line as the culler would write it, PASS and FAIL
lines; exits 1 on a FAIL. Every wait has a deadline; everything started is
ended on the way out.
"""

import asyncio
import logging
import os
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "labextension"))
import jupyterhub_idle_culler  # noqa: E402
from hostkit import FAILED, Jupyter, check, result, run_cell, serve, start_kernel, stop, wait  # noqa: E402
from jupyterlab_gpumem.hub import GPUArbiter  # noqa: E402

TRAIN = r"""
import os, threading, torch
_stop = threading.Event()
w = torch.randn(8192, 8192, device="cuda")
def _train():
    x = torch.randn(8192, 8192, device="cuda")
    while not _stop.is_set():
        x = torch.tanh(x @ w)
        torch.cuda.synchronize()
_t = threading.Thread(target=_train, daemon=True)
_t.start()
print(os.getpid())
"""

STOP = r"""
_stop.set(); _t.join(30); torch.cuda.synchronize()
print("stopped", _t.is_alive(), torch.cuda.memory_reserved())
"""

# The culler's clock, moved as its tests move it.
OFFSET = [timedelta(0)]
_real_utcnow = jupyterhub_idle_culler.utcnow
jupyterhub_idle_culler.utcnow = lambda: _real_utcnow() + OFFSET[0]


class Lines(logging.Handler):
    """Prints and keeps the arbiter's log lines (the culler's log)."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        line = "%s %s" % (record.levelname, record.getMessage())
        self.lines.append(line)
        print("  culler log: " + line, flush=True)


def decide(arb, inactive):
    server = {"name": "", "full_name": "root/", "url": "/"}
    return asyncio.run(arb(inactive, 3600, server))


def main():
    binary = os.environ["GPUMEM_BIN"]
    runtime = os.environ["JUPYTER_RUNTIME_DIR"]
    out = os.environ.get("OUT", tempfile.mkdtemp(prefix="gpumem-arbiter-"))
    sock = os.path.join(tempfile.mkdtemp(prefix="gpumem-arbiter-sock-"), "gpumem.sock")
    log = logging.getLogger("IdleCuller")
    lines = Lines()
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    culler = GPUArbiter(socket=sock, cache_seconds=0)
    gpu_idle = GPUArbiter(socket=sock, cache_seconds=0, gpu_idle_after=3600, gpu_idle_min_bytes=1 << 30)
    server = Jupyter(os.path.join(out, "arbiter-server.log"), args=("--allow-root",))
    daemon = None
    kc = None
    try:
        wait("jupyter server", server.up, 60)
        daemon = serve(
            binary,
            os.path.join(out, "arbiter-daemon.log"),
            "--all-users",
            "--socket-mode",
            "shared",
            "--socket",
            sock,
            "--runtime-dir",
            runtime,
            "--interval=1s",
            "--compute-window=10s",
        )
        wait("the daemon's socket", lambda: os.path.exists(sock), 60)
        kid, kc = start_kernel(server.api, "train.ipynb")
        content, text = run_cell(kc, TRAIN, 180)
        if content["status"] != "ok":
            raise SystemExit("FAIL the training cell: %s" % content)
        result("INFO", "kernel %s (pid %s) trains in a thread; its cell has returned" % (kid, text.strip()))

        def verdict(arb, inactive, rule, words):
            n = len(lines.lines)
            cull = decide(arb, inactive)
            new = lines.lines[n:]
            return (cull,) if new and "rule=%s" % rule in new[-1] and all(w in new[-1] for w in words) else None

        def until(what, arb, inactive, rule, words, timeout, msg):
            """Asks arb each second until its decision is rule with words in
            its line (at most timeout s), then checks it did not cull."""
            t0 = time.monotonic()
            (cull,) = wait(what, lambda: verdict(arb, inactive, rule, words), timeout, every=1)
            check(cull is False, "%s (%.1f s)" % (msg, time.monotonic() - t0))

        until(
            "the arbiter's veto for GPU work",
            culler,
            timedelta(hours=3),
            "veto",
            ["computes on a GPU"],
            90,
            "training, inactive 3 h (limit 1 h): vetoed for its GPU work",
        )
        until(
            "the GPU-idle arbiter's veto",
            gpu_idle,
            timedelta(hours=3),
            "veto",
            ["computes on a GPU"],
            30,
            "training, GPU-idle rule on (1 h, 1 GiB): vetoed too",
        )

        _, text = run_cell(kc, STOP, 60)
        result("INFO", "training loop: %s" % text.strip())
        # Seen idle by the daemon: the culler's rule is held back only by the
        # GPU work of a moment ago ("keep"), no longer vetoed.
        until(
            "the daemon to judge the kernel idle",
            culler,
            timedelta(hours=3),
            "keep",
            ["computed on a GPU"],
            90,
            "stopped: kept while its GPU work is within the limit",
        )
        # The GPU-idle arbiter sees it idle from now on.
        cull = decide(gpu_idle, timedelta(minutes=10))
        check(cull is False and "rule=keep" in lines.lines[-1], "GPU-idle rule, used 10 min ago: kept (idle for seconds only)")

        OFFSET[0] = timedelta(hours=2)
        cull = decide(culler, timedelta(hours=3))
        check(cull is True and "rule=culler" in lines.lines[-1], "culler's clock 2 h on, inactive 3 h: the culler's rule allowed")
        cull = decide(gpu_idle, timedelta(minutes=10))
        check(
            cull is True and "rule=gpu-idle" in lines.lines[-1],
            "GPU-idle rule, used 10 min ago (a keep-alive), holding GPU memory with no GPU work for 2 h: culled",
        )

        stop(daemon)
        daemon = None
        cull = decide(culler, timedelta(hours=3))
        check(cull is False and "cannot ask" in lines.lines[-1], "daemon stopped: vetoed, saying it cannot ask")
    finally:
        if kc is not None:
            kc.stop_channels()
        if daemon is not None:
            stop(daemon)
        server.stop()
        jupyterhub_idle_culler.utcnow = _real_utcnow
    result("INFO", "%d check(s) failed" % len(FAILED) if FAILED else "every check passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""ls_timing.py: standalone `gpumem ls` against nvidia-smi on a GPU host,
in one run, before and after the host gets a shared host's other processes.

Runs ON the lent GPU host (no network, no Go) from the copied checkout's
root, with the binaries built here and carried:

  python3 scripts/gpuhost/ls_timing.py --gpumem bin/gpumem \\
      [--base bin/gpumem-base] [--sleepers 2000] [--runs 20] [--kernels 4]

  0. with --kernels N, a Jupyter server (hostkit's, on the Python running
     this script: gpu_host_current.sh's stack) with N kernels in `ls`'s
     runtime dir, so that `ls` finds, asks and attributes them as on a
     user's host;
  1. one process holding 1 GiB of CUDA memory (torch, when the host's
     Python has it; the GPUs' own processes otherwise), so that both tools
     list something;
  2. 20 alternating runs of `gpumem ls --json` (standalone: its runtime
     dir is a fresh one, no daemon serves it) and of
     `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`, and of
     --base's `gpumem ls --json` when given (another build, today's, in the
     same alternation); medians and minimums, and the ratios;
  3. the same after starting --sleepers `sleep` processes (a process group
     of their own, ended at exit): the /proc of a shared host;
  4. the phases `gpumem ls` reports with GPUMEM_TIMING=1, with sleepers.

Prints INFO lines, then one PASS or FAIL line: gpumem ls <= 1.0 x
nvidia-smi with the sleepers (exit 1 on FAIL). Every wait has a deadline;
the sleepers and the CUDA process are ended on the way out, even after an
error.
"""

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hostkit import Jupyter, result, start_kernel, timing_phases, wait  # noqa: E402

SMI = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"]


def processes():
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def timed(argv, env):
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    took = (time.perf_counter() - t0) * 1000
    if r.returncode != 0:
        raise SystemExit("%s: exit %d: %s" % (" ".join(argv), r.returncode, r.stderr.strip()[-400:]))
    return took, r


def alternate(tools, runs):
    """Runs each tool once per round, for runs rounds: {name: [ms]}."""
    for argv, env in tools.values():  # warm the page cache and the driver
        timed(argv, env)
    out = {name: [] for name in tools}
    for _ in range(runs):
        for name, (argv, env) in tools.items():
            out[name].append(timed(argv, env)[0])
    return out


def report(label, times):
    smi = statistics.median(times["nvidia-smi"])
    parts = []
    for name, xs in times.items():
        parts.append("%s median %.1f ms (min %.1f)" % (name, statistics.median(xs), min(xs)))
    ratios = ["%s %.2f" % (name, statistics.median(xs) / smi) for name, xs in times.items() if name != "nvidia-smi"]
    result("INFO", "%s: %s; ratio to nvidia-smi: %s" % (label, ", ".join(parts), ", ".join(ratios)))
    return statistics.median(times["gpumem ls"]) / smi


def ready(p, timeout):
    """Waits (at most timeout s) for p to print the line "ready"."""
    deadline = time.time() + timeout
    buf = ""
    while time.time() < deadline:
        r, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.time()))
        if not r:
            break
        chunk = os.read(p.stdout.fileno(), 4096).decode()
        if not chunk:
            return False
        buf += chunk
        if "ready\n" in buf:
            return True
    return False


def start_sleepers(n):
    """n sleep processes, children of one shell in a process group of its
    own; returns the shell once all have started."""
    sh = subprocess.Popen(
        ["bash", "-c", "for i in $(seq %d); do sleep 100000 & done; echo ready; wait" % n],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    if not ready(sh, 120):
        end(sh)
        raise SystemExit("%d sleepers did not start within 120 s" % n)
    return sh


def start_cuda_holder(python):
    code = (
        "import torch, time; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)"
    )
    try:
        p = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None
    if ready(p, 120):
        return p
    end(p)
    return None


def end(p):
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGKILL)  # its group: p leads it, not yet waited for
    except ProcessLookupError:
        pass
    p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpumem", default=os.environ.get("GPUMEM_BIN", "bin/gpumem"))
    ap.add_argument("--base", help="another gpumem build to time in the same alternation (today's)")
    ap.add_argument("--sleepers", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--kernels", type=int, default=0, help="a Jupyter server with this many kernels in ls's runtime dir")
    ap.add_argument(
        "--python", default=os.environ.get("GPUKIT_PYTHON", sys.executable), help="a Python with torch, for the CUDA process"
    )
    a = ap.parse_args()

    runtime = tempfile.mkdtemp(prefix="gpumem-ls-timing-")
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=runtime, GPUMEM_SOCKET=os.path.join(runtime, "none.sock"))
    env.pop("GPUMEM_FAKE_GPU", None)
    env.pop("GPUMEM_TIMING", None)
    tools = {"gpumem ls": ([a.gpumem, "ls", "--json"], env), "nvidia-smi": (SMI, env)}
    if a.base:
        tools["base ls"] = ([a.base, "ls", "--json"], env)

    holder = sleepers = server = None
    listed = True
    clients = []
    try:
        if a.kernels:
            os.environ["JUPYTER_RUNTIME_DIR"] = runtime
            server = Jupyter(os.path.join(runtime, "server.log"), args=("--allow-root",))
            wait("jupyter server", server.up, 60)
            for i in range(a.kernels):
                clients.append(start_kernel(server.api, "nb%d.ipynb" % i)[1])
            result("INFO", "a Jupyter server (port %d) with %d kernels in ls's runtime dir" % (server.port, a.kernels))
        holder = start_cuda_holder(a.python)
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout.strip().splitlines()
        result(
            "INFO",
            "%d GPU(s): %s; CUDA process %s; %d processes on the host"
            % (len(gpus), "; ".join(gpus), holder.pid if holder else "none (no torch)", processes()),
        )
        before = report("%d processes" % processes(), alternate(tools, a.runs))

        sleepers = start_sleepers(a.sleepers)
        n = processes()
        after = report("%d processes (%d sleepers)" % (n, a.sleepers), alternate(tools, a.runs))

        if a.kernels:
            # Fast and wrong would be no gain: ls, with the sleepers, still
            # lists every kernel of the server (none holds GPU memory).
            _, r = timed([a.gpumem, "ls", "--json"], env)
            names = [nb.get("notebook") or "" for nb in json.loads(r.stdout or "{}").get("notebooks") or []]
            missing = ["nb%d.ipynb" % i for i in range(a.kernels) if not any(x.endswith("nb%d.ipynb" % i) for x in names)]
            listed = not missing
            result(
                "PASS" if listed else "FAIL",
                "gpumem ls with %d processes lists the server's %d kernels%s"
                % (n, a.kernels, "" if listed else ": missing %s; it listed %s" % (missing, names)),
            )
        phases = {}
        tenv = dict(env, GPUMEM_TIMING="1")
        for _ in range(a.runs):
            _, r = timed([a.gpumem, "ls", "--json"], tenv)
            timing_phases(r.stderr, phases)
        result(
            "INFO",
            "gpumem ls in-process phases with %d processes (medians, ms; nvml_* run beside discover): %s"
            % (n, " ".join("%s=%.2f" % (k, statistics.median(v)) for k, v in phases.items())),
        )
        result("INFO", "ratio to nvidia-smi: %.2f before the sleepers, %.2f with %d" % (before, after, a.sleepers))
    finally:
        end(sleepers)
        end(holder)
        for kc in clients:
            kc.stop_channels()
        if server is not None:
            server.stop()
    ok = after <= 1.0
    result("PASS" if ok else "FAIL", "gpumem ls %.2f x nvidia-smi with %d sleepers (target <= 1.0)" % (after, a.sleepers))
    return 0 if ok and listed else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""oom_check.py: the out-of-memory report and memory snapshots on a real GPU
host, end to end.

Run on the lent GPU host after sourcing gpu-kit's env.sh (the Jupyter stack;
$GPUKIT names where it was unpacked), with GPUMEM_BIN naming a gpumem
binary built with cgo:

  1. a jupyter_server, `gpumem serve`, and hold.ipynb whose kernel holds a
     100 GiB torch tensor on cuda:0 (less on a smaller GPU: --hold-gib);
  2. in train.ipynb a cell asks for more than is left: a real
     torch.OutOfMemoryError. Its report must come within 1 s of the
     traceback, name hold.ipynb with its bytes equal to nvidia-smi's, and
     advise a command; the command is run as written: hold.ipynb's kernel
     must drop to its CUDA context (nvidia-smi) and the cell then succeed;
  3. rec.ipynb: `%gpumem record on` in a fresh kernel initialises no CUDA
     and waits: recording starts after the first cell that uses the GPU;
     a cell allocates; `%gpumem snapshot` hands the pickle to the
     daemon; its reduction's top 3 stacks must hold the allocating line;
     torch's own memory_viz reads the pickle; an out-of-memory error while
     recording saves a snapshot by itself, its oom in the reduction;
  4. recording's cost on a training step (8 x Linear 4096, batch 2048, SGD),
     in a plain Python process, alternating blocks off/on.

Prints PASS/FAIL/INFO lines; exit 1 if any check failed. Every wait has a
deadline.

  GPUMEM_BIN=$PWD/.gpukit/gpumem python3 scripts/gpuhost/oom_check.py
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hostkit import FAILED, Jupyter, result, serve, smi, smi_rows, start_kernel, stop, wait  # noqa: E402

BIN = os.environ.get("GPUMEM_BIN", ".gpukit/gpumem")
OUT = os.environ.get("OUT", "/tmp")
MIME = "application/vnd.gpumem.v1+json"


class Kernel:
    """A session's kernel through jupyter_client, every iopub message kept
    with its arrival time."""

    def __init__(self, api, path):
        self.id, self.kc = start_kernel(api, path, "connection file of " + path)
        self.pid = int(self.run("import os; print(os.getpid())")[1].strip())

    def run(self, code, timeout=300):
        """(reply content, stdout text, [(arrival, msg_type, content)])."""
        msgs = []

        def hook(m):
            msgs.append((time.monotonic(), m["msg_type"], m["content"]))

        r = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        text = "".join(c.get("text", "") for _, t, c in msgs if t == "stream")
        self.last = msgs
        return r["content"], text

    def data(self):
        for _, t, c in self.last:
            if t == "display_data" and MIME in c.get("data", {}):
                return c["data"][MIME]
        return None

    def magic_ready(self):
        r = self.kc.execute_interactive(
            "", silent=True, user_expressions={"m": "get_ipython().find_line_magic('gpumem') is not None"}, timeout=30
        )
        return "True" in json.dumps(r["content"].get("user_expressions", {}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold-gib", type=int, default=100)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    root = os.path.join(os.environ.get("GPUKIT", "/tmp/gpukit"), "work")
    os.makedirs(os.path.join(root, "team"), exist_ok=True)
    for nb in ("hold", "train", "rec"):
        with open(os.path.join(root, "team", nb + ".ipynb"), "w") as f:
            f.write('{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}')
    server = Jupyter(os.path.join(OUT, "oom-jupyter.log"), ["--allow-root"])
    api = server.api
    wait("jupyter server", server.up, 60)
    daemon = serve(BIN, os.path.join(OUT, "oom-gpumem-serve.log"), "--interval=1s", "--no-notebook-alerts")
    try:
        report_and_advice(api, root, a.hold_gib)
        recording(api)
        recording_cost(a.steps)
    finally:
        stop(daemon, server.proc)
    print("%d check(s) failed" % len(FAILED) if FAILED else "all checks passed", flush=True)
    sys.exit(1 if FAILED else 0)


def daemon_get(path):
    """GET on the daemon's socket, as the CLI's user (admin)."""
    import http.client
    import socket

    sock = os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], "gpumem.sock")

    class C(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(sock)

    c = C("local-gpumem.sock", timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"null")


def report_and_advice(api, root, hold_gib):
    hold = Kernel(api, "team/hold.ipynb")
    train = Kernel(api, "team/train.ipynb")
    wait("magics in both kernels", lambda: hold.magic_ready() and train.magic_ready(), 60, every=0.5)
    st, _ = hold.run(
        "import torch\nx = torch.empty(%d << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()" % hold_gib
    )
    if st["status"] != "ok":
        raise SystemExit("FAIL hold.ipynb could not allocate %d GiB: %s" % (hold_gib, st))
    wait("nvidia-smi lists hold.ipynb's kernel", lambda: hold.pid in smi(), 60)
    # The daemon's sample must hold the same figure before the cell runs.
    want_mib = smi()[hold.pid]

    def sampled():
        _, rep = daemon_get("/api/v1/kernels/" + hold.id)
        return rep and rep.get("gpu_memory_bytes") == want_mib << 20

    wait("the daemon's sample of hold.ipynb = nvidia-smi", sampled, 30, every=0.2)
    free = int(smi_rows("--query-gpu=memory.free", "-i", "0")[0][0])
    ask = (free >> 10) + 8  # GiB: more than is left
    cell = "import torch\ny = torch.empty(%d << 30, dtype=torch.uint8, device='cuda')" % ask
    st, _ = train.run(cell)
    err_at = next((t for t, ty, _ in train.last if ty == "error"), None)
    rep_at = next((t for t, ty, c in train.last if ty == "display_data" and MIME in c.get("data", {})), None)
    data = train.data()
    if st["status"] != "error" or err_at is None or data is None:
        result("FAIL", "no out-of-memory report (status %s): %s" % (st["status"], [ty for _, ty, _ in train.last]))
        return
    print(
        "---- the report\n"
        + next(c["data"]["text/plain"] for _, ty, c in train.last if ty == "display_data" and MIME in c.get("data", {}))
        + "\n----",
        flush=True,
    )
    took = rep_at - err_at
    result(
        "PASS" if took <= 1.0 else "FAIL",
        "the report came %.3f s after the traceback (its own work: %s ms; target <= 1 s)" % (took, data.get("elapsed_ms")),
    )
    ev = data.get("event") or {}
    if not ev:
        result("FAIL", "the report has no event from gpumem serve: %s" % data.get("daemon_error"))
        return
    s = smi()
    rows = [h for h in ev.get("holders", []) if h.get("kind") == "notebook" and hold.pid in (h.get("pids") or [])]
    ok = len(rows) == 1 and rows[0]["bytes"] == s.get(hold.pid, -1) << 20
    result(
        "PASS" if ok else "FAIL",
        "the report names hold.ipynb with %s bytes; nvidia-smi: %s MiB" % (rows[0]["bytes"] if rows else None, s.get(hold.pid)),
    )
    m = re.search(r"`(gpumem free [^`]+)`", ev.get("advice", ""))
    result("PASS" if m and "hold.ipynb" in ev["advice"] else "FAIL", "advice: %s" % ev.get("advice"))
    if not m:
        return
    argv = m.group(1).split()
    done = subprocess.run([BIN] + argv[1:], capture_output=True, text=True, timeout=120)
    print("---- %s\n%s%s----" % (m.group(1), done.stdout, done.stderr), flush=True)
    after = wait(
        "hold.ipynb's memory to go", lambda: (lambda v: v if v is not None and v < 2048 else None)(smi().get(hold.pid)), 30
    )
    result(
        "PASS" if after < 2048 else "FAIL",
        "after `%s`: hold.ipynb's kernel holds %d MiB (was %d)" % (m.group(1), after, want_mib),
    )
    st, _ = train.run(cell)
    result(
        "PASS" if st["status"] == "ok" else "FAIL", "the failing cell, run again after following the advice: %s" % st["status"]
    )
    train.run("del y; import torch; torch.cuda.empty_cache()")
    _, evs = daemon_get("/api/v1/oom")
    result("PASS" if any(e["seq"] == ev["seq"] for e in evs.get("events", [])) else "FAIL", "the event is in GET /api/v1/oom")


def reduced(what, kernel, sid):
    """Snapshot sid of kernel as the daemon has it once no longer reducing
    (at most 120 s)."""

    def done():
        _, r = daemon_get("/api/v1/kernels/%s/snapshots/%s" % (kernel.id, sid))
        return r if r and r["snapshot"]["status"] != "reducing" else None

    return wait(what, done, 120, every=0.2)


def recording(api):
    rec = Kernel(api, "team/rec.ipynb")
    wait("magics in rec.ipynb", rec.magic_ready, 60, every=0.5)
    st, out = rec.run("import torch\n%gpumem record on\nprint('initialised', torch.cuda.is_initialized())")
    armed = (rec.data() or {}).get("armed")
    result(
        "PASS" if "initialised False" in out and armed else "FAIL",
        "%%gpumem record on in a fresh kernel leaves CUDA uninitialised and waits for it: %s, armed %s" % (out.strip(), armed),
    )
    # The first cell that uses the GPU: recording starts right after it.
    rec.run("w = torch.zeros(1, device='cuda')")
    rec.run("%gpumem record")
    on = (rec.data() or {}).get("on")
    result("PASS" if on else "FAIL", "recording on after the first cell that used the GPU: %s" % rec.data())
    st, _ = rec.run(
        "a = torch.empty(8 << 30, dtype=torch.uint8, device='cuda')\nb = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')"
    )
    st, _ = rec.run("%gpumem snapshot")
    snap = rec.data() or {}
    print(
        "INFO %%gpumem snapshot: %s" % {k: snap.get(k) for k in ("path", "bytes", "seconds", "daemon", "error", "daemon_error")},
        flush=True,
    )
    sid = (snap.get("daemon") or {}).get("id")
    if not sid:
        result("FAIL", "the snapshot was not handed to gpumem serve: %s" % snap)
        return
    info = reduced("the reduction", rec, sid)
    red = info.get("reduction") or {}
    result(
        "PASS" if red else "FAIL",
        "reduced in %s s: %s"
        % (info["snapshot"].get("reduce_seconds"), info["snapshot"].get("error") or "%d bytes of JSON" % len(json.dumps(red))),
    )
    stacks = {s["id"]: s for s in red.get("stacks", [])}
    tops = (red.get("devices") or [{}])[0].get("top_stacks", [])[:3]
    # The cell's first line allocated a: some frame of a top-3 stack is it.
    hit = [
        ts
        for ts in tops
        if any(
            f["line"] == 1 and ("ipykernel_" in f["filename"] or f["filename"].startswith("<ipython-input"))
            for f in stacks.get(ts["stack"], {}).get("frames", [])
        )
    ]
    shown = ["%s %s" % ((stacks.get(ts["stack"]) or {}).get("where"), ts["bytes"]) for ts in tops]
    result("PASS" if hit else "FAIL", "the allocating line among the top 3 stacks: %s" % shown)
    viz = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pickle, sys; from torch.cuda import _memory_viz as v; "
            "s = pickle.load(open(sys.argv[1], 'rb')); print(len(v.trace_plot(s)) > 0, len(v.segment_plot(s)) > 0)",
            snap["path"],
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    result(
        "PASS" if viz.stdout.strip() == "True True" else "FAIL",
        "torch's memory_viz reads the pickle: %s %s" % (viz.stdout.strip(), viz.stderr[-300:]),
    )
    # An out-of-memory error while recording: a snapshot by itself.
    st, _ = rec.run("c = torch.empty(1 << 50, dtype=torch.uint8, device='cuda')")
    kinds = [c["data"][MIME].get("kind") for _, ty, c in rec.last if ty == "display_data" and MIME in c.get("data", {})]
    oomsnap = [
        c["data"][MIME]
        for _, ty, c in rec.last
        if ty == "display_data" and c.get("data", {}).get(MIME, {}).get("kind") == "snapshot"
    ]
    result(
        "PASS" if kinds == ["oom", "snapshot"] and oomsnap and oomsnap[0].get("reason") == "oom" else "FAIL",
        "an out-of-memory error while recording: %s" % kinds,
    )
    if oomsnap and (oomsnap[0].get("daemon") or {}).get("id"):
        sid2 = oomsnap[0]["daemon"]["id"]
        info = reduced("the reduction of the snapshot after the error", rec, sid2)
        ooms = ((info.get("reduction") or {}).get("devices") or [{}])[0].get("ooms", [])
        result(
            "PASS" if ooms and ooms[-1]["requested_bytes"] >= 1 << 50 else "FAIL",
            "the allocator's oom in the reduction: %s" % ooms[-1:],
        )
    rec.run("%gpumem record off")


COST = r"""
import statistics, sys, time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(2048, 4096, device="cuda")
def step():
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
for _ in range(20):
    step()
torch.cuda.synchronize()
def block(n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return ts
off, on = [], []
for _ in range(int(sys.argv[1]) // 10):
    off += block(10)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
    on += block(10)
    torch.cuda.memory._record_memory_history(enabled=None)
print(statistics.median(off) * 1e3, statistics.median(on) * 1e3)
"""


def recording_cost(steps):
    r = subprocess.run([sys.executable, "-c", COST, str(steps)], capture_output=True, text=True, timeout=600)
    try:
        off, on = [float(v) for v in r.stdout.split()]
    except ValueError:
        result("FAIL", "the training-step benchmark did not run: %s" % r.stderr[-500:])
        return
    result(
        "INFO",
        "recording's cost on a training step (8 x Linear 4096, batch 2048, SGD; %d steps each, alternating blocks of 10): "
        "median %.2f ms off, %.2f ms on: ratio %.3f" % (steps, off, on, on / off),
    )


if __name__ == "__main__":
    main()

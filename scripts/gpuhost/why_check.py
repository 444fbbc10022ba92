#!/usr/bin/env python3
"""why_check.py: %gpumem why, the stray-context flags and free --children on
a real GPU host, against nvidia-smi.

Runs ON the lent GPU host after sourcing a Jupyter stack's environment
(gpu-kit's /tmp/gpukit/env.sh, or gpu_host_current.sh's exports), with
GPUMEM_BIN naming a cgo build of gpumem and python3 the Python with CUDA
torch. It starts its own kernels (ipykernel, connection files in
$JUPYTER_RUNTIME_DIR) and one `gpumem serve` beside them, and checks:

  1. seven holders on CUDA (a closure, an lru_cache, another module's
     attribute, a forward hook, a daemon thread's local, a gc.freeze()d
     cycle, a traceback): why names 7 of 7, each with a chain of at most 6
     hops; its rows add up to the driver's figure (within 1 MiB), which
     equals nvidia-smi's; after the printed fixes and %gpumem free --all, NVML
     shows the kernel at its CUDA context floor (torch reserves nothing,
     and NVML is within 64 MiB of why's "outside the allocators" row);
  2. a million live objects: why within its 2 s budget, without stopping;
  3. fragmentation: an allocation pattern that OOMs with at least 1 GiB
     free; why reports a largest free block smaller than the request and a
     request no larger than the free memory, and advises
     expandable_segments; the same cell runs in a kernel started with
     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
  4. stray context: a child that initialises CUDA and allocates nothing is
     flagged (gpumem ls, the API, %gpumem why); with two GPUs or more, a
     kernel computing on GPU 1 that synchronises the default device is
     flagged on GPU 0;
  5. DataLoader persistent workers holding CUDA memory: gpumem free KERNEL
     --children ends them (NVML drops by their bytes), the kernel lives on
     and its loader starts new workers, which %gpumem free --children ends;
  6. a busy kernel's workers: while a cell runs, one spawned worker computes
     (a matmul loop) and one only holds memory; gpumem free KERNEL --children
     ends the holder alone and names the computing one (pid, SM %) as left
     running, which nvidia-smi still lists and the cell still waits on; then
     --children --pid <it> ends it, and the cell sees it end.
No stray flag may appear in 1, 3 and 5. Every scenario's rows must add up
to the driver's figure.

Prints PASS/FAIL/INFO lines and exits 1 if any check failed. Every wait has
a deadline. Outputs (daemon and kernel logs) go to $OUT (default /tmp).
"""

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostkit  # noqa: E402
from hostkit import FAILED, check, compute_apps, gpu_count, kernel_client, result, run_cell, serve, smi_rows, stop  # noqa: E402

BIN = os.environ.get("GPUMEM_BIN", ".gpukit/gpumem")
OUT = os.environ.get("OUT", "/tmp")
PY = os.environ.get("GPUKIT_PYTHON", sys.executable)
RUNTIME = os.environ.get("JUPYTER_RUNTIME_DIR") or tempfile.mkdtemp(prefix="why-runtime-")
MIB, GIB = 1 << 20, 1 << 30
# A wait that times out fails its step (main reports it), the next still runs.
wait = functools.partial(hostkit.wait, every=0.1, raises=RuntimeError)


def smi():
    """{(gpu index, pid): bytes} from nvidia-smi."""
    idx = {u: int(i) for i, u in smi_rows("--query-gpu=index,uuid")}
    return {(idx.get(u, -1), pid): mib * MIB for (u, pid), mib in compute_apps().items()}


def smi_pids(pids):
    return sum(b for (_g, p), b in smi().items() if p in pids)


def gpumem(*args, timeout=180):
    return subprocess.run([BIN] + list(args), capture_output=True, text=True, timeout=timeout)


def report():
    r = gpumem("ls", "--json")
    return json.loads(r.stdout)


class Kernel(object):
    """An ipykernel with its connection file in the runtime dir, driven by
    jupyter_client as a notebook's frontend would."""

    def __init__(self, name, env=None):
        self.id = str(uuid.uuid4())
        self.cf = os.path.join(RUNTIME, "kernel-%s.json" % self.id)
        self.log = open(os.path.join(OUT, "kernel-%s.log" % name), "w")
        self.proc = subprocess.Popen(
            [PY, "-m", "ipykernel_launcher", "-f", self.cf],
            env=dict(os.environ, PYTHONFAULTHANDLER="1", **(env or {})),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        wait("kernel %s's connection file" % name, lambda: os.path.exists(self.cf) and os.path.getsize(self.cf) > 0, 60)
        self.kc = kernel_client(self.cf)
        wait("gpumem serve injects kernel %s" % name, self.injected, 60)

    def injected(self):
        st, out, _ = self.cell("print('_gpumem_magics' in __import__('sys').modules)")
        return st == "ok" and out.strip() == "True"

    def cell(self, code, timeout=120):
        try:
            c, text = run_cell(self.kc, code, timeout)
        except TimeoutError:
            # Where the kernel is stuck: faulthandler writes every thread's
            # stack to the kernel's log on SIGABRT.
            os.kill(self.pid, signal.SIGABRT)
            raise TimeoutError(
                "a cell ran over %ss (stacks in kernel-*.log): %s" % (timeout, code.strip().splitlines()[0][:80])
            ) from None
        return c["status"], text, "%s: %s" % (c.get("ename", ""), c.get("evalue", ""))

    def magic(self, line):
        """The data dict and the text %gpumem LINE shows."""
        st, out, err = self.cell(
            "import json as _j\nfrom IPython.utils.capture import capture_output as _cap\nwith _cap() as _c:\n"
            "    get_ipython().run_line_magic('gpumem', %r)\n"
            "print(_j.dumps([o.data.get('application/vnd.gpumem.v1+json') for o in _c.outputs][-1]))\n"
            "print('\\n'.join(o.data.get('text/plain', '') for o in _c.outputs))" % line
        )
        if st != "ok":
            raise RuntimeError("%%gpumem %s: %s" % (line, err))
        first, _, rest = out.partition("\n")
        return json.loads(first), rest

    def tree(self):
        for nb in report()["notebooks"]:
            if nb["kernel_id"] == self.id:
                return nb
        return None

    def close(self):
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()
        try:
            os.remove(self.cf)  # the daemon then forgets the kernel
        except OSError:
            pass


def rows_add_up(k, data, text, what):
    """The rows add up to the driver's figure, which equals nvidia-smi's."""
    drv = data.get("driver") or {}
    total = sum(r["bytes"] for r in data.get("rows", []))
    nb = k.tree() or {}
    want = smi_pids(set(nb.get("pids") or [k.pid]))
    ok = "bytes" in drv and abs(total - drv["bytes"]) <= MIB and abs(drv["bytes"] - want) <= MIB
    check(
        ok,
        "%s: rows %.1f MiB, the driver's figure %.1f MiB, nvidia-smi for the tree %.1f MiB (unexplained %s B)"
        % (what, total / MIB, drv.get("bytes", -1) / MIB, want / MIB, drv.get("unexplained")),
    )
    if not ok:
        print(text, flush=True)


def no_flags(what):
    flags = [
        (nb["kernel_id"][:8], sc["gpu"], sc["pid"], sc["label"])
        for nb in report()["notebooks"]
        for sc in nb.get("stray_contexts") or []
    ]
    check(not flags, "%s: no stray-context flag (%s)" % (what, flags or "none"))


SEVEN = r"""
import functools, gc, sys, threading, types, torch
M = 1 << 20
def make():
    w = torch.empty(64 * M, dtype=torch.uint8, device="cuda")
    return lambda: w
f = make()
@functools.lru_cache(maxsize=8)
def load(n):
    return torch.empty(n * M, dtype=torch.uint8, device="cuda")
load(128)
stash = types.ModuleType("gpumem_stash"); sys.modules["gpumem_stash"] = stash
stash.T = torch.empty(192 * M, dtype=torch.uint8, device="cuda"); del stash
model = torch.nn.Linear(4, 4).cuda()
def mk(t):
    return lambda mod, inp, out: t
h = model.register_forward_hook(mk(torch.empty(256 * M, dtype=torch.uint8, device="cuda")))
ev, ready = threading.Event(), threading.Event()
def worker():
    t = torch.empty(320 * M, dtype=torch.uint8, device="cuda")
    ready.set(); ev.wait(600)
th = threading.Thread(target=worker, name="stash-worker", daemon=True); th.start(); ready.wait(60)
class Node(object):
    pass
n = Node(); n.me = n; n.t = torch.empty(384 * M, dtype=torch.uint8, device="cuda"); del n
gc.freeze()
def fail():
    big = torch.empty(448 * M, dtype=torch.uint8, device="cuda")
    1 / 0
torch.cuda.synchronize()
"""
SIZES = {
    64: "a closure cell",
    128: "a functools cache",
    192: "a module attribute",
    256: "a hook registry",
    320: "a live thread's frame",
    384: "gc.freeze()'s permanent generation",
    448: "traceback",
}


def seven_holders():
    k = Kernel("seven")
    try:
        print("INFO running the seven holders' cell", flush=True)
        st, _, err = k.cell(SEVEN)
        print("INFO the cell: %s" % st, flush=True)
        if st != "ok":
            return result("FAIL", "seven holders: %s" % err)
        k.cell("fail()")  # raises: IPython keeps its traceback
        wait("the daemon samples the kernel", lambda: (k.tree() or {}).get("gpu_memory_bytes"), 30)
        print("INFO %gpumem why", flush=True)
        # Should why be stuck, every thread's stack after 30 s (a C thread
        # of faulthandler's writes it, whatever holds the GIL).
        k.cell(
            "import faulthandler as _fh; _fh.dump_traceback_later(30, file=open(%r, 'w'))" % os.path.join(OUT, "why-stacks.txt")
        )
        data, text = k.magic("why")
        k.cell("_fh.cancel_dump_traceback_later()")
        print("---- %gpumem why (seven holders)\n" + text + "----", flush=True)
        found = {}
        for r in data.get("rows", []):
            for mib in SIZES:
                if r["bytes"] == mib * MIB:
                    found[mib] = r
        # gc.freeze()'s list is read on CPython 3.11 only (frozen.py). The
        # cell freezes every holder it made before gc.freeze(), so on another
        # Python only the traceback (made after) can be named, and why must
        # say that it could not search the frozen objects.
        st, out, _ = k.cell("import sys; print(sys.version_info[:2] == (3, 11))")
        reads_frozen = out.strip() == "True"
        want = sorted(SIZES) if reads_frozen else [448]
        check(sorted(found) == want, "seven holders: why names %s (want %s)" % (sorted(found), want))
        if not reads_frozen:
            fz = data.get("frozen") or {}
            check(
                fz.get("read") is False and "cannot read gc.freeze()" in fz.get("note", ""),
                "the frozen objects: not searched, and why says so (%s)" % fz,
            )
        for mib, r in sorted(found.items()):
            ok = 1 <= r.get("hops", 99) <= 6 and (
                SIZES[mib] == "traceback" or r.get("holder") == SIZES[mib] or r.get("root") == SIZES[mib]
            )
            check(
                ok,
                "%d MiB held by %s: %s (%d hops), fix %r"
                % (mib, r.get("holder"), " -> ".join(r.get("chain", [])), r.get("hops", -1), r.get("fix")),
            )
        rows_add_up(k, data, text, "seven holders")
        no_flags("seven holders")
        if not reads_frozen:
            return result("INFO", "the fixes of the frozen holders: not printed on this Python, not run")
        outside = sum(r["bytes"] for r in data["rows"] if r["category"] == "outside")
        fixes = "\n".join(r["fix"] for mib, r in found.items() if mib != 320) + "\nev.set(); th.join(30)"
        st, _, err = k.cell(fixes)
        check(st == "ok", "the printed fixes run: %s" % (err if st != "ok" else fixes.replace("\n", "; ")))
        k.magic("free --all")  # the named variable's fix (%gpumem free model) and the caches
        st, out, _ = k.cell("import torch; print(torch.cuda.memory_reserved())")
        reserved = int(out.strip() or -1)
        floor = wait("NVML settles", lambda: smi_pids({k.pid}) or None, 10)
        check(
            reserved == 0 and floor <= outside + 64 * MIB,
            "after the fixes and %%gpumem free: torch reserves %d B; NVML %.0f MiB, the context floor (why's outside row) %.0f MiB"
            % (reserved, floor / MIB, outside / MIB),
        )
    finally:
        k.close()


def million_objects():
    k = Kernel("million")
    try:
        k.cell(
            "class _O(object):\n    pass\n_heap = []\nfor _i in range(330000):\n    _o = _O(); _o.a = _i; "
            "_heap.append(_o); _heap.append([_i]); _heap.append({'k': _i})"
        )
        k.cell(SEVEN.replace("gc.freeze()", ""))
        st, out, _ = k.cell("import gc; print(len(gc.get_objects()))")
        data, text = k.magic("why")
        ok = data.get("elapsed_ms", 1e9) <= 2000 and not data.get("stopped")
        check(
            ok,
            "why with %s live objects: %s ms, stopped %s (budget 2 s)"
            % (out.strip(), data.get("elapsed_ms"), data.get("stopped")),
        )
    finally:
        k.close()


FRAG = r"""
import torch
G = 1 << 30
torch.cuda.init()
big = torch.empty(8 * G, dtype=torch.uint8, device="cuda"); del big      # one 8 GiB segment, cached
blocks = [torch.empty(G, dtype=torch.uint8, device="cuda") for _ in range(8)]  # carved out of it
del blocks[::2]                                                           # 4 holes of 1 GiB inside it
free, _total = torch.cuda.mem_get_info()
filler = torch.empty(free - (3 * G) // 2, dtype=torch.uint8, device="cuda")   # 1.5 GiB left on the device
torch.cuda.synchronize()
x = torch.empty(2 * G, dtype=torch.uint8, device="cuda")                  # no block of 2 GiB anywhere
print("allocated 2 GiB")
"""


def fragmentation():
    k = Kernel("frag")
    try:
        st, _, err = k.cell(FRAG)
        check(
            st == "error" and "out of memory" in err.lower(),
            "the fragmenting cell OOMs without expandable segments (%s)" % err[:160],
        )
        data, text = k.magic("why")
        print("---- %gpumem why (fragmentation)\n" + text + "----", flush=True)
        fr = data.get("fragmentation") or {}
        ok = (
            fr.get("case") == "oom" and fr["largest_free_block"] < fr["request"] <= fr["free"] and fr["free"] - fr["request"] >= 0
        )
        check(
            ok,
            "why: largest free block %s < request %s <= free %s"
            % (fr.get("largest_free_block"), fr.get("request"), fr.get("free")),
        )
        check(fr.get("free", 0) >= GIB, "the OOM came with %.2f GiB free (at least 1 GiB)" % (fr.get("free", 0) / GIB))
        check(
            any("expandable_segments:True" in a for a in data.get("advice", [])),
            "why advises expandable_segments, kernelspec or %env",
        )
        rows_add_up(k, data, text, "fragmentation")
        no_flags("fragmentation")
    finally:
        k.close()
    k = Kernel("frag-expandable", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    try:
        st, out, err = k.cell(FRAG)
        check(
            st == "ok" and "allocated 2 GiB" in out,
            "with expandable_segments:True the same cell runs (%s)" % (err if st != "ok" else "ok"),
        )
    finally:
        k.close()


def stray_contexts():
    k = Kernel("stray")
    try:
        st, out, err = k.cell(
            "import subprocess, sys, torch\n"
            "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
            "_c = subprocess.Popen([sys.executable, '-c', \"import torch, time; torch.cuda.synchronize(); "
            "print('ready', flush=True); time.sleep(600)\"], stdout=subprocess.PIPE, text=True)\n"
            "assert _c.stdout.readline().strip() == 'ready'\nprint(_c.pid)"
        )
        child = int(out.strip())
        wait("nvidia-smi lists the child", lambda: any(p == child for (_g, p) in smi()), 60)
        nb = wait("the daemon flags the child", lambda: (lambda n: n if n and n.get("stray_contexts") else None)(k.tree()), 30)
        flags = [(sc["gpu"], sc["pid"]) for sc in nb["stray_contexts"]]
        check(
            flags == [(0, child)],
            "a child that initialised CUDA and allocates nothing is flagged: %s (want [(0, %d)]); %s"
            % (flags, child, [sc["label"] for sc in nb["stray_contexts"]]),
        )
        ls = gpumem("ls").stdout
        check("stray context" in ls and str(child) in ls, "gpumem ls shows it:\n" + ls)
        data, text = k.magic("why")
        check(any(sc["pid"] == child for sc in data.get("stray_contexts", [])), "%gpumem why shows it")
        rows_add_up(k, data, text, "stray context")
    finally:
        k.close()
    if gpu_count() < 2:
        return result(
            "INFO", "the default-device case needs two GPUs: this host has %d (covered on the simulated GPU)" % gpu_count()
        )
    k = Kernel("default-device")
    try:
        k.cell("import torch\nx = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:1')\ntorch.cuda.synchronize()")
        nb = wait("the daemon flags GPU 0", lambda: (lambda n: n if n and n.get("stray_contexts") else None)(k.tree()), 30)
        data, text = k.magic("why")
        flags = [(sc["gpu"], sc["pid"], sc["cause"]) for sc in data.get("stray_contexts", [])]
        check(flags == [(0, k.pid, "default_device")], "synchronize() on the default device while computing on GPU 1: %s" % flags)
        rows_add_up(k, data, text, "default device")
    finally:
        k.close()


WORKERS = r"""
import os, sys, json, torch
sys.path.insert(0, %r)
from torch.utils.data import DataLoader
import gpuds
dl = DataLoader(gpuds.DS(), batch_size=4, num_workers=2, persistent_workers=True,
                multiprocessing_context="spawn", worker_init_fn=gpuds.hold)
n = sum(int(b.sum()) for b in dl)
print(json.dumps([w.pid for w in dl._iterator._workers]))
"""
GPUDS = """import torch
HELD = []
class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.tensor(i)
def hold(_worker_id):
    HELD.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
"""


def workers():
    d = tempfile.mkdtemp(prefix="gpuds-")
    with open(os.path.join(d, "gpuds.py"), "w") as f:
        f.write(GPUDS)
    k = Kernel("workers")
    try:
        k.cell("import torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()")
        st, out, err = k.cell(WORKERS % d, timeout=600)
        if st != "ok":
            return result("FAIL", "DataLoader workers: %s" % err)
        pids = json.loads(out.strip().splitlines()[-1])
        held = wait(
            "nvidia-smi lists the workers",
            lambda: (lambda s: s if all(any(p == w for (_g, p) in s) for w in pids) else None)(smi()),
            60,
        )
        wbytes = sum(b for (_g, p), b in held.items() if p in pids)
        wait(
            "the daemon attributes the workers",
            lambda: (lambda n: n if n and set(pids) <= set(n["pids"]) else None)(k.tree()),
            30,
        )
        data, text = k.magic("why")
        rows_add_up(k, data, text, "DataLoader workers")
        no_flags("DataLoader workers holding CUDA memory")
        before = smi_pids({k.pid} | set(pids))
        r = gpumem("free", k.id, "--children")
        print("---- gpumem free --children\n" + r.stdout + r.stderr + "----", flush=True)
        gone = wait("the workers end", lambda: not any(p in pids for (_g, p) in smi()) or None, 30)
        after = smi_pids({k.pid} | set(pids))
        check(
            r.returncode == 0 and gone and before - after >= wbytes - MIB,
            "gpumem free --children: workers %s ended; NVML %.0f -> %.0f MiB (workers held %.0f MiB)"
            % (pids, before / MIB, after / MIB, wbytes / MIB),
        )
        check(k.proc.poll() is None, "the kernel itself lives on")
        st, out, err = k.cell(
            "n2 = sum(int(b.sum()) for b in dl); print(n2 == n, json.dumps([w.pid for w in dl._iterator._workers]))", timeout=600
        )
        again = json.loads(out.split(" ", 1)[1]) if st == "ok" else []
        check(st == "ok" and out.startswith("True"), "the kernel is usable: the next epoch runs on new workers %s" % again)
        held2 = wait(
            "nvidia-smi lists the new workers",
            lambda: (lambda s: s if all(any(p == w for (_g, p) in s) for w in again) else None)(smi()),
            60,
        )
        wbytes2 = sum(b for (_g, p), b in (held2 or {}).items() if p in again)
        wait(
            "the daemon attributes the new workers",
            lambda: (lambda n: n if n and set(again) <= set(n["pids"]) else None)(k.tree()),
            30,
        )
        data, text = k.magic("free --children")
        print("---- %gpumem free --children\n" + text + "----", flush=True)
        gone = wait("the new workers end", lambda: not any(p in again for (_g, p) in smi()) or None, 30)
        check(gone and k.proc.poll() is None, "%gpumem free --children ends the new workers; the kernel lives on")
        # The kernel's teardown ends them before it asks gpumem serve, which
        # read the figures before that teardown: its report names them.
        ended = {p.get("pid") for p in data.get("ended") or []}
        returned = data.get("returned_bytes") or 0
        check(
            set(again) <= ended and returned >= wbytes2 - MIB,
            "%%gpumem free --children's report: ended %s, returned %.0f MiB (nvidia-smi had %.0f MiB on them)"
            % (sorted(ended), returned / MIB, wbytes2 / MIB),
        )
    finally:
        k.close()


BUSYW = """import time
import torch
def compute(seconds):
    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        a = a @ a
        a = a / a.norm()
    torch.cuda.synchronize()
def hold(seconds):
    x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(seconds)
"""
BUSY_CELL = """import sys, json, multiprocessing as mp
sys.path.insert(0, %(d)r)
import busyw
ctx = mp.get_context("spawn")
pc = ctx.Process(target=busyw.compute, args=(300,))
ph = ctx.Process(target=busyw.hold, args=(300,))
pc.start(); ph.start()
open(%(d)r + "/pids.json", "w").write(json.dumps([pc.pid, ph.pid]))
pc.join()
print("compute worker exit code", pc.exitcode)
"""


def busy_workers():
    d = tempfile.mkdtemp(prefix="busyw-")
    with open(os.path.join(d, "busyw.py"), "w") as f:
        f.write(BUSYW)
    k = Kernel("busy-workers")
    try:
        msg_id = k.kc.execute(BUSY_CELL % {"d": d})
        pidfile = os.path.join(d, "pids.json")
        wait("the cell starts its workers", lambda: os.path.exists(pidfile) and os.path.getsize(pidfile) > 0, 120)
        with open(pidfile) as f:
            pc, ph = json.load(f)
        wait("nvidia-smi lists both workers", lambda: (lambda s: {pc, ph} <= {p for (_g, p) in s} or None)(smi()), 120)
        wait(
            "the daemon judges the notebook computing",
            lambda: (
                lambda n: n if n and {pc, ph} <= set(n["pids"]) and (n.get("compute") or {}).get("state") == "computing" else None
            )(k.tree()),
            120,
        )
        held = smi_pids({ph})
        r = gpumem("free", k.id, "--children")
        print("---- gpumem free --children (a cell runs)\n" + r.stdout + r.stderr + "----", flush=True)
        gone = wait("the holder ends", lambda: ph not in {p for (_g, p) in smi()} or None, 30)
        check(bool(gone), "free --children of a busy kernel ended the idle holder %d (%.0f MiB)" % (ph, held / MIB))
        check(pc in {p for (_g, p) in smi()}, "the computing worker %d is left running (nvidia-smi lists it)" % pc)
        named = [ln for ln in (r.stdout + r.stderr).splitlines() if "left running" in ln and str(pc) in ln]
        check(
            bool(named) and "SM" in named[0],
            "the reply names the computing worker with its SM %%: %s" % (named[:1] or r.stdout[-300:]),
        )
        r2 = gpumem("free", k.id, "--children", "--pid", str(pc))
        print("---- gpumem free --children --pid %d\n" % pc + r2.stdout + r2.stderr + "----", flush=True)
        gone = wait("the confirmed worker ends", lambda: pc not in {p for (_g, p) in smi()} or None, 30)
        check(r2.returncode == 0 and bool(gone), "--children --pid %d ended the confirmed computing worker" % pc)
        reply = None
        while reply is None:
            m = k.kc.get_shell_msg(timeout=60)
            if m["parent_header"].get("msg_id") == msg_id:
                reply = m
        check(reply["content"]["status"] == "ok" and k.proc.poll() is None, "the cell ends and the kernel lives on")
    finally:
        k.close()


def main():
    # timeout(1)'s SIGTERM unwinds: every kernel and the daemon are ended.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("why_check.py: terminated"))
    os.makedirs(RUNTIME, exist_ok=True)
    os.environ["JUPYTER_RUNTIME_DIR"] = RUNTIME
    daemon = serve(BIN, os.path.join(OUT, "why-gpumem-serve.log"), "--interval=500ms", "--runtime-dir", RUNTIME)
    try:
        wait("gpumem serve's socket", lambda: os.path.exists(os.path.join(RUNTIME, "gpumem.sock")), 30)
        steps = (seven_holders, million_objects, fragmentation, stray_contexts, workers, busy_workers)
        only = os.environ.get("WHY_STEPS", "").split(",")  # e.g. WHY_STEPS=seven_holders
        for step in [s for s in steps if only == [""] or s.__name__ in only]:
            print("== %s" % step.__name__, flush=True)
            try:
                step()
            except Exception as e:
                result("FAIL", "%s: %s: %s" % (step.__name__, type(e).__name__, e))
    finally:
        stop(daemon)
    print("%d check(s) failed" % len(FAILED) if FAILED else "all checks passed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

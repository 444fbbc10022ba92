#!/usr/bin/env python3
"""util_check.py: GPU utilization per notebook on a real GPU host, and
reclaim and culling never ending a process that computes.

Run on the lent GPU host from the checkout's root, after sourcing gpu-kit's
env.sh (the Jupyter stack), with GPUMEM_BIN naming a cgo build of gpumem and,
optionally, GPUMEM_DRIVER_TEST the test binary of nvml/driver
(go test -c -o .gpukit/driver.test ./nvml/driver):

  1. reclaim: a notebook starts a detached job that trains (os.system("nohup
     … &"), a matmul loop with SGD for TRAIN_SECONDS) and a worker that only
     holds 1 GiB (subprocess.Popen(start_new_session=True)); gpumem serve
     (--interval=1s, --reclaim-grace=5s) attributes both; per-notebook and
     per-process SM % from `gpumem ls --json` agree with `nvidia-smi pmon -s
     u` within its sampling; after a REST restart of the kernel the worker is
     gone (NVML and /proc) and the job is left running (the daemon's log and
     report say so), runs on and finishes every step;
  2. culling at seconds (--cull-idle=10s --cull-warn=10s
     --cull-action=shutdown): an idle kernel whose detached child computes is
     not culled while the child computes; an idle kernel that only holds
     memory is shut down;
  3. GPU-idle culling beside a keep-alive (--cull-gpu-idle=15s
     --cull-warn=10s --cull-action=shutdown): both notebooks run a `pass`
     cell every 2 s; the one that only holds memory (1 GiB and 1 GiB of
     PyTorch's cache) is warned, its cache freed (nvidia-smi drops), warned
     again and shut down; the one whose kernel computes is never warned;
  4. the cost of the NVML call per sample: nvmlDeviceGetProcessUtilization
     (its two calls, as gpumem makes them) against the compute process list,
     through ctypes, 1,000 times a device while the job computes; and, with
     GPUMEM_DRIVER_TEST, gpumem's whole Sample with and without it
     (BenchmarkRealSampleUtilization).

Prints PASS/FAIL/INFO lines; exits 1 if a check failed. Every wait has a
deadline. Logs go to $OUT (default /tmp).
"""

import ctypes
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostkit  # noqa: E402
from hostkit import FAILED, connect, result, run_cell, smi_rows  # noqa: E402

BIN = os.environ.get("GPUMEM_BIN", ".gpukit/gpumem")
DRIVER_TEST = os.environ.get("GPUMEM_DRIVER_TEST", "")
OUT = os.environ.get("OUT", "/tmp")
TRAIN_SECONDS = int(os.environ.get("TRAIN_SECONDS", "90"))
# A wait that times out is a failed check, the part goes on.
wait = functools.partial(hostkit.wait, every=0.2, raises=TimeoutError)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def smi_pids():
    return {int(pid) for (pid,) in smi_rows("--query-compute-apps=pid")}


def pmon():
    """{pid: (sm, mem)} from one `nvidia-smi pmon -s u -c 1` (its own 1 s
    sample); "-" (no sample: the process ran nothing) counts 0."""
    out = subprocess.run(["nvidia-smi", "pmon", "-s", "u", "-c", "1"], capture_output=True, text=True, timeout=30).stdout
    got = {}
    for line in out.splitlines():
        f = line.split()
        if not f or f[0].startswith("#") or len(f) < 5 or not f[1].isdigit():
            continue
        num = lambda v: 0 if v == "-" else int(v)  # noqa: E731
        sm, mem = num(f[3]), num(f[4])
        old = got.get(int(f[1]), (0, 0))
        got[int(f[1])] = (old[0] + sm, old[1] + mem)
    return got


class Jupyter(hostkit.Jupyter):
    def __init__(self, root):
        super().__init__(os.path.join(OUT, "util-jupyter.log"), ["--ServerApp.root_dir=" + root])
        self.root = root
        wait("jupyter server", self.up, 90)

    def session(self, name):
        with open(os.path.join(self.root, name), "w") as f:
            f.write('{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}')
        s = self.api("POST", "api/sessions", {"path": name, "type": "notebook", "name": name, "kernel": {"name": "python3"}})
        return s["id"], s["kernel"]["id"]

    def kernels(self):
        return {k["id"] for k in self.api("GET", "api/kernels")}

    def run(self, kid, code, timeout=300):
        """Runs code in kernel kid; returns what it printed."""
        kc = connect(kid, "connection file of %s" % kid, raises=TimeoutError)
        try:
            content, text = run_cell(kc, code, timeout)
        finally:
            kc.stop_channels()
        if content["status"] != "ok":
            raise RuntimeError("kernel %s: %s" % (kid, content))
        return text


class Serve:
    def __init__(self, name, *args):
        self.log = os.path.join(OUT, "util-serve-%s.log" % name)
        self.proc = hostkit.serve(BIN, self.log, *args)
        sock = os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], "gpumem.sock")
        wait("gpumem serve's socket", lambda: os.path.exists(sock) and self.report() is not None, 30)

    def report(self):
        r = subprocess.run([BIN, "ls", "--json"], capture_output=True, text=True, timeout=60)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def logs(self, message, **fields):
        found = []
        with open(self.log) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("message") == message and all(str(e.get(k)) == str(v) for k, v in fields.items()):
                    found.append(e)
        return found

    def stop(self):
        hostkit.stop(self.proc)


TRAIN = r"""
import os, sys, time, torch
progress = sys.argv[1]
x = torch.randn(8192, 8192, device="cuda")
w = torch.randn(8192, 8192, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-9)
torch.cuda.synchronize()
with open(progress, "w") as f:
    f.write("ready %d\n" % os.getpid())
steps, end = 0, time.time() + float(sys.argv[2])
while time.time() < end:
    loss = (x @ w).square().mean()
    opt.zero_grad(); loss.backward(); opt.step(); torch.cuda.synchronize()
    steps += 1
with open(progress, "a") as f:
    f.write("done %d\n" % steps)
"""

HOLD = r"""
import os, sys, time, torch
y = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
with open(sys.argv[1], "w") as f:
    f.write("ready %d\n" % os.getpid())
time.sleep(900)
"""


def start_job(jup, kid, name, code, detach_with, arg=""):
    """Starts, from inside kernel kid, a detached job running code; returns
    (pid, progress file). detach_with: "nohup" (os.system) or "session"
    (Popen, start_new_session)."""
    script = os.path.join(OUT, "util-%s.py" % name)
    progress = os.path.join(OUT, "util-%s.progress" % name)
    with open(script, "w") as f:
        f.write(code)
    if os.path.exists(progress):
        os.remove(progress)
    if detach_with == "nohup":
        cell = "import os, sys\nos.system('nohup %%s %s %s %s > %s 2>&1 &' %% sys.executable)\n" % (
            script,
            progress,
            arg,
            os.path.join(OUT, "util-%s.out" % name),
        )
    else:
        cell = (
            "import subprocess, sys\n"
            "_%s = subprocess.Popen([sys.executable, %r, %r, %r], start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=open(%r, 'w'))\n"
            % (name, script, progress, arg, os.path.join(OUT, "util-%s.out" % name))
        )
    jup.run(kid, cell)
    line = wait("%s ready" % name, lambda: os.path.exists(progress) and open(progress).read().split("\n")[0], 180)
    return int(line.split()[1]), progress


def notebook_of(rep, kid):
    for nb in (rep or {}).get("notebooks", []):
        if nb["kernel_id"] == kid:
            return nb
    return None


def process_sm(nb, pid):
    for p in nb.get("processes", []):
        if p["pid"] == pid:
            us = [g.get("utilization") for g in p["per_gpu"]]
            return None if any(u is None for u in us) else sum(u["sm_percent"] for u in us)
    return None


def reclaim_part(jup):
    serve = Serve("reclaim", "--interval=1s", "--reclaim-grace=5s")
    try:
        _, kid = jup.session("train.ipynb")
        jup.run(kid, "import torch; _x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()")
        job, progress = start_job(jup, kid, "train", TRAIN, "nohup", str(TRAIN_SECONDS))
        worker, _ = start_job(jup, kid, "worker", HOLD, "session")
        result(
            "INFO",
            "kernel %s: training job pid %d (nohup), worker pid %d (own session, 1 GiB, computes nothing)" % (kid, job, worker),
        )
        wait(
            "gpumem serve attributes the job and the worker to the notebook",
            lambda: (lambda nb: nb and job in nb["pids"] and worker in nb["pids"])(notebook_of(serve.report(), kid)),
            60,
        )
        # SM %: ours (the daemon's last sample) and pmon's (its own 1 s
        # sample), alternating, ten readings each.
        ours_job, ours_nb, smi_job, smi_nb = [], [], [], []
        for _ in range(10):
            nb = notebook_of(serve.report(), kid)
            if nb and nb.get("utilization") is not None:
                ours_nb.append(nb["utilization"]["sm_percent"])
            sm = process_sm(nb, job) if nb else None
            if sm is not None:
                ours_job.append(sm)
            pm = pmon()
            smi_job.append(pm.get(job, (0, 0))[0])
            smi_nb.append(sum(pm.get(p, (0, 0))[0] for p in (nb or {}).get("pids", [])))
        print(
            "---- gpumem ls (through the daemon)\n"
            + subprocess.run([BIN, "ls"], capture_output=True, text=True, timeout=60).stdout
            + "----"
        )
        if len(ours_job) < 5 or len(ours_nb) < 5:
            result(
                "FAIL",
                "SM %%: gpumem reported it in %d (process) and %d (notebook) of 10 readings" % (len(ours_job), len(ours_nb)),
            )
        else:
            for what, a, b in (("training job", ours_job, smi_job), ("notebook (kernel + children)", ours_nb, smi_nb)):
                ma, mb = statistics.median(a), statistics.median(b)
                result(
                    "PASS" if abs(ma - mb) <= 15 else "FAIL",
                    "SM %% of the %s: gpumem median %.0f %s, nvidia-smi pmon median %.0f %s (agree within 15 points)"
                    % (what, ma, a, mb, b),
                )
        # A process that only holds memory: NVML may still charge it a
        # share of the samples while another process of the GPU computes
        # (pmon shows the same), so ours must agree with pmon's, and be known.
        nb = notebook_of(serve.report(), kid)
        w_sm, w_pmon = process_sm(nb, worker), pmon().get(worker, (0, 0))[0]
        result(
            "PASS" if w_sm is not None and abs(w_sm - w_pmon) <= 15 else "FAIL",
            "the worker that only holds memory: SM %s %% (nvidia-smi pmon %s %%; agree within 15 points, known)" % (w_sm, w_pmon),
        )

        t0 = time.monotonic()
        jup.api("POST", "api/kernels/%s/restart" % kid)
        try:
            wait("the worker gone", lambda: not alive(worker) and worker not in smi_pids(), 30)
            result("PASS", "worker %d ended %.1f s after the REST restart (grace window 5 s)" % (worker, time.monotonic() - t0))
        except TimeoutError as e:
            result("FAIL", "worker %d: %s" % (worker, e))
        try:
            wait("the job left running in the log", lambda: serve.logs("orphan left running: computing", pid=job), 30)
            result(
                "PASS",
                "gpumem serve left the training job %d running: %s"
                % (job, serve.logs("orphan left running: computing", pid=job)[0].get("reason")),
            )
        except TimeoutError as e:
            result("FAIL", "training job %d: %s" % (job, e))

        # The report lists it from the sample after reclaim's decision.
        def listed():
            return [x for x in (serve.report() or {}).get("left_running") or [] if x["pid"] == job]

        try:
            lr = wait("the report lists the job left running", listed, 10)
            result("PASS", "report's left_running: %s" % lr[0]["message"])
        except TimeoutError as e:
            result("FAIL", "report's left_running: %s (%s)" % ((serve.report() or {}).get("left_running"), e))
        result("PASS" if alive(job) else "FAIL", "the training job %d still runs after the restart" % job)
        try:
            done = wait(
                "the job to finish",
                lambda: "done" in open(progress).read() and open(progress).read(),
                TRAIN_SECONDS + 120,
                every=1,
            )
            steps = int(done.split("done")[1].split()[0])
            result(
                "PASS" if steps > 0 else "FAIL", "the training job ran on and finished: %d steps in %d s" % (steps, TRAIN_SECONDS)
            )
        except TimeoutError as e:
            result("FAIL", "training job %d did not finish: %s (alive %s)" % (job, e, alive(job)))
        for pid in (job, worker):
            if alive(pid):
                os.kill(pid, 9)
    finally:
        serve.stop()


def cull_part(jup):
    _, k_comp = jup.session("computes.ipynb")
    _, k_hold = jup.session("holds.ipynb")
    jup.run(k_comp, "import torch; _x = torch.empty(512 << 20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()")
    child, progress = start_job(jup, k_comp, "cullchild", TRAIN, "session", "120")
    jup.run(k_hold, "import torch; _x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()")
    result(
        "INFO",
        "computes.ipynb kernel %s, its detached child %d trains 120 s; holds.ipynb kernel %s holds 1 GiB"
        % (k_comp, child, k_hold),
    )
    serve = Serve(
        "cull",
        "--interval=1s",
        "--cull-idle=10s",
        "--cull-warn=10s",
        "--cull-action=shutdown",
        "--cull-min-memory=256MiB",
        "--reclaim-grace=5s",
    )
    try:
        try:
            wait("holds.ipynb's kernel culled", lambda: k_hold not in jup.kernels(), 90, every=1)
            result("PASS", "the idle kernel that only holds memory was shut down by culling")
        except TimeoutError as e:
            result("FAIL", "holds.ipynb: %s" % e)
        # Idle 10 s and warned 10 s, and more: observed for 30 s more, it
        # would have gone by the end.
        deadline = time.monotonic() + 30
        culled = False
        while time.monotonic() < deadline and not culled:
            culled = k_comp not in jup.kernels()
            time.sleep(1)
        warned = serve.logs("idle kernel holds GPU memory: warned", kernel_id=k_comp)
        result(
            "PASS" if not culled and not warned and alive(child) else "FAIL",
            "the idle kernel whose detached child computes: culled %s, warned %d times, child alive %s"
            % (culled, len(warned), alive(child)),
        )
        print(
            "---- gpumem ls --idle (through the daemon)\n"
            + subprocess.run([BIN, "ls", "--idle"], capture_output=True, text=True, timeout=60).stdout
            + "----"
        )
    finally:
        if alive(child):
            os.kill(child, 9)
        serve.stop()


KEEPALIVE_EVERY = 2  # seconds between the keep-alive's cells


def gpu_idle_part(jup):
    """--cull-gpu-idle beside a keep-alive: keepalive.ipynb holds 1 GiB and
    1 GiB of PyTorch's cache and runs a cell every 2 s, with no GPU work; it
    is warned, its cache freed (nvidia-smi drops), warned again and shut
    down. train.ipynb runs the same keep-alive while a thread of its kernel
    computes: never warned."""
    _, k_idle = jup.session("keepalive.ipynb")
    _, k_train = jup.session("train.ipynb")
    pid_idle = int(
        jup.run(
            k_idle,
            "import os, torch\n_x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
            "_y = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del _y\ntorch.cuda.synchronize()\n"
            "print(os.getpid())",
        ).strip()
    )
    jup.run(
        k_train,
        "import threading, time, torch\n"
        "def _train():\n"
        "    x = torch.randn(8192, 8192, device='cuda')\n"
        "    end = time.time() + 300\n"
        "    while time.time() < end:\n"
        "        (x @ x).sum().item()\n"
        "threading.Thread(target=_train, daemon=True).start()",
    )
    cells = {k_idle: [], k_train: []}
    stop = threading.Event()

    def keepalive():
        while not stop.wait(KEEPALIVE_EVERY):
            for kid in list(cells):
                try:
                    jup.run(kid, "pass", timeout=30)
                    cells[kid].append(time.time())
                except Exception:  # a culled kernel answers no more
                    cells.pop(kid, None)

    ka = threading.Thread(target=keepalive, daemon=True)
    ka.start()
    before = dict(smi_rows_mib())
    result(
        "INFO",
        "keepalive.ipynb kernel %s (pid %d) holds 1 GiB + 1 GiB cached: nvidia-smi %s MiB; train.ipynb kernel %s computes; "
        "a `pass` cell every %d s in both" % (k_idle, pid_idle, before.get(pid_idle), k_train, KEEPALIVE_EVERY),
    )
    serve = Serve(
        "gpuidle",
        "--interval=1s",
        "--compute-window=10s",
        "--cull-gpu-idle=15s",
        "--cull-warn=10s",
        "--cull-action=shutdown",
        "--cull-min-memory=512MiB",
        "--reclaim-grace=5s",
    )
    try:

        def logged(message, **fields):
            return lambda: serve.logs(message, **fields)

        try:
            first = wait(
                "keepalive.ipynb warned",
                logged("idle kernel holds GPU memory: warned", kernel_id=k_idle, gpu_idle_rule=True, action="free"),
                120,
            )[0]
            result(
                "PASS",
                "keepalive.ipynb warned by the GPU-idle rule at %s while its cells ran (next: free its caches)" % first["time"],
            )
            wait("its caches freed", logged("idle kernel's GPU caches freed", kernel_id=k_idle), 60)
            after = wait(
                "nvidia-smi to drop",
                lambda: (smi_rows_mib().get(pid_idle, 0) <= before.get(pid_idle, 0) - 900) and smi_rows_mib(),
                30,
            )
            result(
                "PASS",
                "its caches freed first: nvidia-smi %s -> %s MiB, the kernel still running"
                % (before.get(pid_idle), after.get(pid_idle)),
            )
            wait(
                "warned again",
                logged("idle kernel holds GPU memory: warned", kernel_id=k_idle, gpu_idle_rule=True, action="shutdown"),
                60,
            )
            wait("shut down", lambda: k_idle not in jup.kernels(), 60)
            during = [t for t in cells.get(k_idle, []) if time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) > first["time"]]
            result(
                "PASS" if during else "FAIL",
                "keepalive.ipynb shut down through its server after a second warning; "
                "keep-alive cells answered after its first warning: %d" % len(during),
            )
        except TimeoutError as e:
            result("FAIL", "keepalive.ipynb: %s" % e)
        warned = serve.logs("idle kernel holds GPU memory: warned", kernel_id=k_train)
        result(
            "PASS" if not warned and k_train in jup.kernels() and len(cells.get(k_train, [])) > 3 else "FAIL",
            "train.ipynb (computing, same keep-alive): warned %d times, still running %s, keep-alive cells %d"
            % (len(warned), k_train in jup.kernels(), len(cells.get(k_train, []))),
        )
    finally:
        stop.set()
        ka.join(timeout=60)
        serve.stop()


def smi_rows_mib():
    """{pid: MiB} from nvidia-smi's compute apps."""
    return {int(pid): int(mib) for pid, mib in smi_rows("--query-compute-apps=pid,used_memory")}


class ProcUtil(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class ProcInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def cost_part(_jup):
    """The NVML calls themselves, timed through ctypes while a job computes."""
    script = os.path.join(OUT, "util-costjob.py")
    progress = os.path.join(OUT, "util-costjob.progress")
    with open(script, "w") as f:
        f.write(TRAIN)
    p = subprocess.Popen([sys.executable, script, progress, "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait("the cost job ready", lambda: os.path.exists(progress) and "ready" in open(progress).read(), 180)
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        assert nv.nvmlInit_v2() == 0
        n = ctypes.c_uint()
        nv.nvmlDeviceGetCount_v2(ctypes.byref(n))
        for i in range(n.value):
            h = ctypes.c_void_p()
            nv.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
            last = ctypes.c_ulonglong(0)
            t_util, t_list, samples = [], [], 0
            for _ in range(1000):
                t0 = time.perf_counter()
                cnt = ctypes.c_uint(0)
                ret = nv.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(cnt), last)
                if ret == 7 and cnt.value:  # INSUFFICIENT_SIZE: the count, then the samples
                    buf = (ProcUtil * cnt.value)()
                    ret = nv.nvmlDeviceGetProcessUtilization(h, buf, ctypes.byref(cnt), last)
                    if ret == 0:
                        for s in buf[: cnt.value]:
                            if s.pid and s.timeStamp > last.value:
                                last = ctypes.c_ulonglong(s.timeStamp)
                                samples += 1
                t_util.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                cnt = ctypes.c_uint(0)
                if nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), None) == 7 and cnt.value:
                    buf2 = (ProcInfo * (cnt.value + 4))()
                    cnt = ctypes.c_uint(cnt.value + 4)
                    nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), buf2)
                t_list.append(time.perf_counter() - t0)
            mu, ml = statistics.median(t_util) * 1e6, statistics.median(t_list) * 1e6
            result(
                "INFO",
                "GPU %d: nvmlDeviceGetProcessUtilization (count + samples) median %.1f µs (p90 %.1f), compute process list median %.1f µs: ratio %.2f; %d new samples over 1,000 calls"
                % (i, mu, sorted(t_util)[900] * 1e6, ml, mu / ml if ml else 0, samples),
            )
        nv.nvmlShutdown()
        if DRIVER_TEST:
            b = subprocess.run(
                [
                    DRIVER_TEST,
                    "-test.run",
                    "^$",
                    "-test.bench",
                    "RealSampleUtilization",
                    "-test.benchtime",
                    "300x",
                    "-test.count",
                    "3",
                    "-test.v",
                ],
                capture_output=True,
                text=True,
                timeout=600,
                env=dict(os.environ, GPUMEM_TEST_REAL_NVML="1"),
            )
            print(
                "---- gpumem's Sample with and without per-process utilization (BenchmarkRealSampleUtilization)\n"
                + b.stdout
                + b.stderr
                + "----"
            )
            if b.returncode != 0:
                result("FAIL", "BenchmarkRealSampleUtilization failed")
    finally:
        p.kill()
        p.wait(timeout=20)


def main():
    root = os.path.join(OUT, "util-notebooks")
    os.makedirs(root, exist_ok=True)
    jup = Jupyter(root)
    try:
        for part in (reclaim_part, cull_part, gpu_idle_part, cost_part):
            try:
                part(jup)
            except Exception as e:  # a part that breaks is a failure, the next still runs
                result("FAIL", "%s: %r" % (part.__name__, e))
    finally:
        jup.stop()
    print("%d check(s) failed" % len(FAILED) if FAILED else "all util checks passed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""gpu_host_pods.py: `gpumem serve --pod-kernels` with real GPU memory.

No cluster runs on the lent GPU host, so this plays one Kubernetes pod as
the kubelet makes it: its own network namespace (only its loopback up) and
mount namespace (its runtime dir a tmpfs no other namespace sees), in a
cgroup laid out as the cgroupfs driver lays out a pod's. In it a real
ipykernel holds a torch tensor on the GPU and starts three GPU workers in
sessions of their own (as pools and inference servers do, so that a
restart's kill of the kernel's process group misses them). One worker stays
in the pod, one is moved into another pod's cgroup, one out of every pod.

Then, against nvidia-smi:
  1. the daemon attaches to the kernel through the pod's namespaces (its
     file only through the kernel's root, its ports only in its netns) and
     names it after its pod;
  2. the notebook's per-process figures equal nvidia-smi's;
  3. a free through the daemon runs in the pod's kernel;
  4. kill -9 of the kernel: the worker in its pod is ended (gone from
     nvidia-smi within 5 s); the one in another pod and the one outside any
     pod keep their GPU memory.

Run as root on the GPU host with GPUMEM_BIN and a python with torch and
ipykernel (scripts/gpuhost/gpu_host_current.sh runs it so). PASS/FAIL/INFO lines;
exit 1 if any check failed; every wait has a deadline.
"""

import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_host_check import FAILED, result, smi, wait  # noqa: E402

BIN = os.environ.get("GPUMEM_BIN", ".gpukit/gpumem")
PY = sys.executable
CGROUP = "/sys/fs/cgroup"
MIB = 1 << 20

LOOPBACK_UP = """import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH", b"lo", flags | 1))"""

WORKER = (
    "import torch, time; x = torch.empty(%d << 20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize(); time.sleep(3600)"
)

POD_SCRIPT = """set -e
read _ready
"$PYTHON" -c "$LOOPBACK_UP"
mount -t tmpfs -o mode=0755 tmpfs "$POD_DIR"
mkdir -p "$POD_DIR/runtime" "$POD_DIR/ipython/profile_default"
printf '%s\\n' "$KERNEL_CONFIG" > "$POD_DIR/ipython/profile_default/ipython_kernel_config.py"
export IPYTHONDIR="$POD_DIR/ipython" JPY_SESSION_NAME=/home/jovyan/train.ipynb
exec "$PYTHON" -m ipykernel_launcher -f "$POD_DIR/runtime/kernel-$KERNEL_ID.json"
"""


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(self.path)


def api(sock, method, path, body=None):
    c = UnixHTTP(sock)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def cgroup(rel):
    path = os.path.join(CGROUP, rel.lstrip("/"))
    os.makedirs(path, exist_ok=True)
    return path


def move(cg, pid):
    with open(os.path.join(cg, "cgroup.procs"), "w") as f:
        f.write(str(pid))


def members(cg):
    with open(os.path.join(cg, "cgroup.procs")) as f:
        return f.read().split()


def children(pid):
    out = []
    for task in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


def main():
    if os.geteuid() != 0:
        result("FAIL", "pods: namespaces, cgroups and setns need root")
        return
    pod_a, pod_b = str(uuid.uuid4()), str(uuid.uuid4())
    cg_a = cgroup("/kubepods/besteffort/pod%s/%s" % (pod_a, secrets.token_hex(32)))
    cg_b = cgroup("/kubepods/besteffort/pod%s/%s" % (pod_b, secrets.token_hex(32)))
    cg_host = cgroup("/gpumem-pods-host-%s" % secrets.token_hex(4))
    top = tempfile.mkdtemp(prefix="gpumem-pods-")
    pod_dir = os.path.join(top, "pod")
    os.mkdir(pod_dir)
    kernel_id = str(uuid.uuid4())
    conn = os.path.join(pod_dir, "runtime", "kernel-%s.json" % kernel_id)
    config = "c.IPKernelApp.exec_lines = %r" % [
        "import torch; _held = torch.empty(1024 << 20, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()",
        "import subprocess as _sp, sys as _sys; _w = "
        + repr(WORKER)
        + "; _workers = [_sp.Popen([_sys.executable, '-c', _w % _n],"
        " start_new_session=True, stdin=_sp.DEVNULL, stdout=_sp.DEVNULL, stderr=_sp.DEVNULL) for _n in (512, 768, 1024)]",
    ]
    env = dict(os.environ, PYTHON=PY, LOOPBACK_UP=LOOPBACK_UP, POD_DIR=pod_dir, KERNEL_ID=kernel_id, KERNEL_CONFIG=config)
    pod = subprocess.Popen(
        ["unshare", "--net", "--mount", "--propagation", "private", "--fork", "--", "sh", "-c", POD_SCRIPT],
        stdin=subprocess.PIPE,
        env=env,
        text=True,
    )
    daemon = None
    procs = []
    try:
        # The pod's first process joins its cgroup before starting anything.
        kernel = wait("the pod's shell", lambda: (children(pod.pid) or [None])[0], 30)
        move(cg_a, kernel)
        pod.stdin.write("go\n")
        pod.stdin.flush()
        if os.path.exists(conn):
            result("FAIL", "pods: the kernel's connection file is visible outside the pod")
        workers = wait(
            "the kernel's three workers to hold GPU memory",
            lambda: (lambda ws: ws if len(ws) == 3 and all(w in smi() for w in ws) and kernel in smi() else None)(
                [c for c in children(kernel) if alive(c)]
            ),
            180,
        )
        procs = [kernel] + workers
        in_pod, in_pod_b, outside = workers
        move(cg_b, in_pod_b)
        move(cg_host, outside)
        before = smi()
        result(
            "INFO", "pods: kernel %d and workers %s hold %s MiB (nvidia-smi)" % (kernel, workers, {p: before[p] for p in procs})
        )

        rt = os.path.join(top, "daemon-runtime")
        os.makedirs(rt, mode=0o700)
        sock = os.path.join(rt, "gpumem.sock")
        denv = dict(os.environ, JUPYTER_RUNTIME_DIR=rt, HOME=top)
        log = open(os.path.join(top, "daemon.log"), "w")
        daemon = subprocess.Popen(
            [BIN, "serve", "--pod-kernels", "--interval=500ms", "--rescan=1s", "--reclaim-grace=1s", "--log-format=json"],
            env=denv,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def kernel_status():
            try:
                st, body = api(sock, "GET", "/api/v1/kernels")
            except OSError:
                return None
            if st != 200:
                return None
            for k in json.loads(body).get("kernels", []):
                if k["kernel_id"] == kernel_id and k["pid"] == kernel and k["alive"]:
                    return k
            return None

        t0 = time.monotonic()
        k = wait("the daemon to attach to the pod's kernel", kernel_status, 60)
        ok = k["connection_file"].startswith("pod:" + pod_a + "/")
        result(
            "PASS" if ok else "FAIL",
            "pods: attached to kernel %s in %.1f s through the pod's namespaces: connection file %s, notebook %s"
            % (kernel_id, time.monotonic() - t0, k["connection_file"], k["notebook"]),
        )

        def notebook():
            st, body = api(sock, "GET", "/api/v1/notebooks")
            for nb in json.loads(body).get("notebooks", []) if st == 200 else []:
                if nb["kernel_id"] == kernel_id and len(nb.get("processes", [])) == 4:
                    return nb
            return None

        nb = wait("the notebook's four GPU processes in the daemon's report", notebook, 60)
        now = smi()
        got = {p["pid"]: sum(g["bytes"] for g in p["per_gpu"]) // MIB for p in nb["processes"]}
        want = {p: now.get(p) for p in procs}
        result("PASS" if got == want else "FAIL", "pods: per-process MiB, gpumem %s = nvidia-smi %s" % (got, want))

        st, body = api(sock, "POST", "/api/v1/kernels/%s/free" % kernel_id, {})
        result(
            "PASS" if st == 200 else "FAIL",
            "pods: a free through the daemon ran in the pod's kernel (HTTP %d, %d bytes of report)" % (st, len(body)),
        )

        os.kill(kernel, signal.SIGKILL)
        t0 = time.monotonic()
        wait("the worker in the kernel's pod to leave the GPU", lambda: in_pod not in smi(), 30)
        gone = time.monotonic() - t0
        result(
            "PASS" if gone < 5 else "FAIL",
            "pods: the dead kernel's worker %d in its pod gone from nvidia-smi %.2f s after kill -9 (target < 5 s)"
            % (in_pod, gone),
        )

        # The daemon logs its decision on every process the dead kernel's
        # tree recorded: the other two must be left alone, and still hold
        # their memory after.
        def decisions():
            with open(os.path.join(top, "daemon.log")) as f:
                lines = [json.loads(x) for x in f if x.startswith("{")]
            seen = {line.get("pid"): line for line in lines if line.get("message", "").startswith("orphan")}
            return seen if in_pod_b in seen and outside in seen else None

        seen = wait("the daemon's decisions on the other two workers", decisions, 30)
        for pid in (in_pod, in_pod_b, outside):
            if pid in seen:
                result("INFO", "pods: daemon: pid %d: %s %s" % (pid, seen[pid]["message"], seen[pid].get("reason", "")))
        now = smi()
        for pid, where in ((in_pod_b, "in another pod"), (outside, "outside any pod")):
            ok = alive(pid) and now.get(pid) == before[pid] and seen[pid]["message"] != "orphan ended"
            result(
                "PASS" if ok else "FAIL",
                "pods: worker %d %s left alone, still holds %s MiB (before %s)" % (pid, where, now.get(pid), before[pid]),
            )
    finally:
        for p in procs:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        if daemon:
            daemon.terminate()
            daemon.wait(timeout=30)
        pod.kill()
        pod.wait(timeout=30)
        for cg in (cg_a, cg_b, cg_host):
            wait("cgroup %s empty" % cg, lambda cg=cg: not members(cg), 30)
            for d in (cg, os.path.dirname(cg)):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
    print("GPU-HOST-PODS: %s" % ("FAIL" if FAILED else "PASS"))
    sys.exit(1 if FAILED else 0)

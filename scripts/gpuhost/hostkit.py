"""hostkit.py: what the GPU-host checks share, written once: the PASS/FAIL
bookkeeping, waits with a deadline, nvidia-smi's queries, a Jupyter server
on a random port with a token and its REST API, `gpumem serve`, a
notebook's kernel and a client that waits for it, a cell's output, the
kernel holding CUDA memory with a child of its own session, and the phases
`gpumem ls` reports with GPUMEM_TIMING=1.

Standard library only (jupyter_client is imported where a kernel is
reached): the scripts run on a GPU host with no network. They import it by
their folder, as `python3 scripts/gpuhost/X.py` puts it on sys.path:

  from hostkit import FAILED, result, wait
"""

import json
import os
import secrets
import subprocess
import time
import urllib.request

# The messages of the checks that failed, in order; a script exits 1 when
# it is not empty.
FAILED = []


def result(status, msg):
    """Prints "STATUS msg" (PASS, FAIL, INFO); a FAIL is kept in FAILED."""
    print("%s %s" % (status, msg), flush=True)
    if status == "FAIL":
        FAILED.append(msg)


def check(ok, msg):
    """PASS or FAIL by ok; returns ok."""
    result("PASS" if ok else "FAIL", msg)
    return ok


def wait(what, cond, timeout, every=0.05, raises=SystemExit):
    """Polls cond every `every` s until it returns something true, and
    returns that; after timeout s raises `raises`: SystemExit (the script
    stops, its message a FAIL line) or an exception the caller catches
    (TimeoutError, RuntimeError), "timed out after Ns waiting for WHAT"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(every)
    msg = "timed out after %ss waiting for %s" % (timeout, what)
    raise raises("FAIL " + msg if raises is SystemExit else msg)


# --- nvidia-smi


def smi_rows(*query, timeout=30, check=False):
    """nvidia-smi's CSV rows for a query ("--query-compute-apps=pid,used_memory",
    and any further arguments such as "-i", "0"), each a list of its fields,
    stripped, without header or units. With check, a non-zero exit raises
    subprocess.CalledProcessError; without, its output is read as it is."""
    argv = ["nvidia-smi", *query, "--format=csv,noheader,nounits"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise subprocess.CalledProcessError(r.returncode, argv, r.stdout, r.stderr)
    return [[x.strip() for x in line.split(",")] for line in r.stdout.strip().splitlines()]


def compute_apps():
    """{(gpu_uuid, pid): MiB} from nvidia-smi --query-compute-apps."""
    return {(uuid, int(pid)): int(mib) for uuid, pid, mib in smi_rows("--query-compute-apps=gpu_uuid,pid,used_memory")}


def smi():
    """{pid: MiB} over all GPUs, from compute_apps."""
    procs = {}
    for (_, pid), mib in compute_apps().items():
        procs[pid] = procs.get(pid, 0) + mib
    return procs


def gpus(timeout=30):
    """The lines of `nvidia-smi -L` that name a GPU."""
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=timeout).stdout
    return [line for line in out.strip().splitlines() if line.startswith("GPU ")]


def gpu_count():
    return len(gpus())


# --- Jupyter and gpumem


class Jupyter:
    """A Jupyter server on a random port of 127.0.0.1 with a random token, in
    a session of its own, its output in log. cmd is what starts it (another
    Python's `-m jupyter_server`), token_option the option that sets its
    token, args anything else it needs (--allow-root, a root dir). It is
    started, not waited for: wait("jupyter server", j.up, 60)."""

    def __init__(self, log, args=(), cmd=("jupyter", "server"), token_option="--ServerApp.token"):
        self.port = 18000 + secrets.randbelow(1000)
        self.token = secrets.token_hex(16)
        self.base = "http://127.0.0.1:%d/" % self.port
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [*cmd, "--port=%d" % self.port, token_option + "=" + self.token, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def api(self, method, path, body=None):
        """The REST API: path relative to the server's root ("api/sessions");
        body sent as JSON; the answer's JSON, or None when it has none."""
        req = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": "token " + self.token, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
            return json.loads(data) if data else None

    def up(self):
        """GET api/status's answer once the server answers it, else None."""
        try:
            return self.api("GET", "api/status")
        except Exception:
            return None

    def stop(self, timeout=20):
        stop(self.proc, timeout=timeout)


def serve(binary, log, *args):
    """`gpumem serve --log-format=json ARGS` in a session of its own, its
    log (stderr) in log."""
    with open(log, "w") as err:
        return subprocess.Popen([binary, "serve", "--log-format=json", *args], stderr=err, start_new_session=True)


def stop(*procs, timeout=20):
    """SIGTERM to every proc, then waits for each (at most timeout s) and
    kills one that is still there."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()


def kernel_client(cf, timeout=90):
    """A BlockingKernelClient on connection file cf whose kernel answers:
    a fresh kernel's heartbeat may not be up yet ("Kernel died"), so it
    tries again, for at most timeout s."""
    from jupyter_client import BlockingKernelClient

    deadline = time.monotonic() + timeout
    while True:
        kc = BlockingKernelClient(connection_file=cf)
        kc.load_connection_file()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=10)
            return kc
        except RuntimeError:
            kc.stop_channels()
            if time.monotonic() > deadline:
                raise


def connect(kid, what="connection file", raises=SystemExit, timeout=60):
    """A kernel_client for kernel kid of a Jupyter server, once its
    connection file is in $JUPYTER_RUNTIME_DIR (waited for as what, at most
    timeout s, then raises as wait does)."""
    cf = os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], "kernel-%s.json" % kid)
    wait(what, lambda: os.path.exists(cf), timeout, raises=raises)
    return kernel_client(cf)


def start_kernel(api, path, what="connection file"):
    """A session of the notebook at path (relative to the server's root)
    with a python3 kernel, through api (Jupyter.api): (kernel id, a
    kernel_client for it, see connect)."""
    sess = api(
        "POST",
        "api/sessions",
        {"path": path, "type": "notebook", "name": os.path.basename(path), "kernel": {"name": "python3"}},
    )
    kid = sess["kernel"]["id"]
    return kid, connect(kid, what)


def run_cell(kc, code, timeout):
    """Runs code through kc: (the execute reply's content, what it printed).
    A cell that fails does not abort the next one: with stop_on_error,
    ipykernel aborts the requests that reach it while it handles the error,
    and on a loaded host the next cell's request arrives in that window."""
    out = []
    r = kc.execute_interactive(
        code,
        timeout=timeout,
        stop_on_error=False,
        output_hook=lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
    )
    return r["content"], "".join(out)


# A kernel's cell: 2 GiB of torch on cuda:0, and a child in a session of its
# own (so Jupyter's process-group kill misses it) holding 1 GiB; prints both
# pids.
HOLD_WITH_CHILD = r"""
import os, subprocess, sys, torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
_child = subprocess.Popen([sys.executable, "-c",
    "import torch, time; y = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)"],
    start_new_session=True, stdout=subprocess.PIPE, text=True)
assert _child.stdout.readline().strip() == "ready"
print(os.getpid(), _child.pid)
"""


def hold_with_child(kc, kid):
    """Runs HOLD_WITH_CHILD in kernel kid: (kernel pid, child pid); a cell
    that fails ends the script (SystemExit, a FAIL line)."""
    content, text = run_cell(kc, HOLD_WITH_CHILD, 180)
    if content["status"] != "ok":
        raise SystemExit("FAIL kernel code: %s" % content)
    kpid, cpid = [int(v) for v in text.split()]
    result("INFO", "kernel %s pid %d holds a 2 GiB tensor; child pid %d (own session) holds 1 GiB" % (kid, kpid, cpid))
    return kpid, cpid


def timing_phases(stderr, phases):
    """Adds the phases of a "gpumem timing: name=1.23ms ..." line in stderr
    (GPUMEM_TIMING=1) to phases, {name: [ms]}."""
    for line in stderr.splitlines():
        if line.startswith("gpumem timing:"):
            for kv in line.split(":", 1)[1].split():
                k, v = kv.split("=")
                phases.setdefault(k, []).append(float(v[: -len("ms")]))

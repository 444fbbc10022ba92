"""A real stack for the extension's tests: JupyterLab 4 (or jupyter_server)
from this Python, gpumem serve built from the repository with the simulated
GPU file, on 127.0.0.1 with temporary dirs and tokens. Every wait has a
deadline; every process started here is ended here."""

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
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
# The one Python writer of the simulated-GPU file, pinned to the Go one
# (internal/testenv's golden file).
sys.path.insert(0, str(REPO / "internal" / "testenv"))
import simgpu  # noqa: E402

CI = os.environ.get("CI") == "true"
GiB = 1 << 30


def need(ok, what):
    """A missing real part fails under CI=true and skips elsewhere."""
    if ok:
        return
    if CI:
        pytest.fail(what + " (CI=true: a missing part fails)")
    pytest.skip(what)


def wait_for(what, check, timeout=30.0, every=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            v = check()
            if v:
                return v
        except Exception as e:  # noqa: BLE001  (the thing is not up yet: any error)
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last!r})")
        time.sleep(every)


def free_port():
    """A port of 127.0.0.1 free a moment ago, drawn below Linux's ephemeral
    range, as Go's testenv.FreePort draws it: a port a bind to port 0 gave
    is the kind the kernels' ports and outgoing connections take next."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = 20000 + secrets.randbelow(max(low - 20000, 1))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpumem_binary(tmp):
    """GPUMEM_BIN, else a fresh build of ./cmd/gpumem."""
    b = os.environ.get("GPUMEM_BIN")
    if b:
        return b
    need(shutil.which("go"), "go is needed to build gpumem")
    out = os.path.join(tmp, "gpumem")
    subprocess.run(["go", "build", "-o", out, "./cmd/gpumem"], cwd=REPO, check=True)
    return out


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Proc:
    def __init__(self, argv, env, log):
        self.log = log
        with open(log, "wb") as out:
            self.p = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # Ctrl-C reaches the server as in a terminal, even when the
                # tests were started where SIGINT is ignored (a shell's
                # background job): Python keeps an ignored SIGINT ignored.
                preexec_fn=_default_sigint,
                # Not the source tree: the installed package is what is tested.
                cwd=os.path.dirname(log),
            )

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(5)

    def tail(self):
        try:
            return Path(self.log).read_text(errors="replace")[-3000:]
        except OSError:
            return ""


class Server:
    """One Jupyter server (JupyterLab or plain jupyter_server), run by the
    stack's Python. autostart=False (the default) turns jupyterlab-gpumem's
    autostart off: the tests that want a daemon start it (Stack.start_daemon)."""

    def __init__(self, stack, app, root, autostart=False):
        self.stack = stack
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = "http://127.0.0.1:%d/" % self.port
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        argv = [
            stack.python,
            "-m",
            app,
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=%d" % self.port,
            "--ServerApp.port_retries=0",
            "--IdentityProvider.token=" + self.token,
            "--ServerApp.root_dir=" + str(root),
            "--ServerApp.allow_root=True",
            "--Gpumem.autostart=%s" % autostart,
        ]
        if app == "jupyterlab":
            argv += [
                "--LabApp.news_url=",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.workspaces_dir=" + str(stack.tmp / ("ws-%d" % self.port)),
                "--LabApp.user_settings_dir=" + str(stack.settings),
            ]
        self.proc = Proc(argv, stack.env, str(stack.tmp / ("%s-%d.log" % (app, self.port))))
        wait_for(
            f"{app} on {self.url}",
            lambda: self.get("api/status").status_code == 200,
            timeout=180,  # a loaded 2-core CI machine starts JupyterLab slowly
        )

    def headers(self):
        return {"Authorization": "token " + self.token}

    def get(self, path, **kw):
        return httpx.get(self.url + path, headers=kw.pop("headers", self.headers()), timeout=30, **kw)

    def post(self, path, body=None, **kw):
        return httpx.post(
            self.url + path,
            headers=kw.pop("headers", self.headers()),
            json=body,
            timeout=90,
            **kw,
        )

    def notebook(self, name, cells=()):
        """Writes a notebook into the server's root."""
        nb = {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": {},
                    "outputs": [],
                    "source": c,
                }
                for c in cells
            ],
            "metadata": {
                "kernelspec": {
                    "name": "python3",
                    "display_name": "Python 3",
                    "language": "python",
                }
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (self.root / name).write_text(json.dumps(nb))

    def start_session(self, name):
        r = self.post(
            "api/sessions",
            {
                "path": name,
                "type": "notebook",
                "name": name,
                "kernel": {"name": "python3"},
            },
        )
        r.raise_for_status()
        return r.json()["kernel"]["id"]

    def sessions(self):
        return self.get("api/sessions").json()

    def state(self):
        r = self.get("gpumem/api/v1/state")
        r.raise_for_status()
        return r.json()


class Stack:
    """Temporary dirs, a simulated GPU file and the servers and daemon of one
    test. python runs the servers (default this one); bin is the gpumem
    binary (default: GPUMEM_BIN, else a fresh go build); env_path, when
    given, is the PATH the servers and the daemon see."""

    def __init__(self, tmp, python=None, bin=None, env_path=None):
        self.tmp = Path(tmp)
        self.python = python or sys.executable
        self.runtime = self.tmp / "runtime"
        self.runtime.mkdir(mode=0o700)
        self.gpus_file = self.tmp / "gpus.json"
        self.socket = self.runtime / "gpumem.sock"
        self.env = dict(
            os.environ,
            JUPYTER_RUNTIME_DIR=str(self.runtime),
            GPUMEM_FAKE_GPU=str(self.gpus_file),
            JUPYTER_CONFIG_DIR=str(self.tmp / "config"),
            JUPYTER_DATA_DIR=str(self.tmp / "data"),
            IPYTHONDIR=str(self.tmp / "ipython"),
            PYTHONUNBUFFERED="1",
        )
        self.env.pop("GPUMEM_SOCKET", None)
        if env_path is not None:
            self.env["PATH"] = env_path
        self.servers = []
        self.daemon = None
        # No "notified about Jupyter news?" toast among the ones tests count.
        self.settings = self.tmp / "settings"
        nf = self.settings / "@jupyterlab" / "apputils-extension"
        nf.mkdir(parents=True)
        (nf / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
        self.bin = bin or gpumem_binary(str(self.tmp))
        self.set_gpu({})

    def set_gpu(self, used_by_pid, total=80 * GiB, name="Simulated H200", sm_by_pid=None):
        """Rewrites the simulated GPU file (atomically: the daemon re-reads it
        every sample); sm_by_pid plays processes that compute."""
        sm = sm_by_pid or {}
        procs = [simgpu.proc(pid, b, sm_percent=sm.get(pid, 0)) for pid, b in used_by_pid.items()]
        self.write_gpus([simgpu.gpu(total, procs, name=name, uuid="GPU-0")])

    def write_gpus(self, gpus):
        """Writes the simulated GPU file listing gpus (simgpu.gpu), atomically."""
        simgpu.write(self.gpus_file, gpus)

    def server(self, app="jupyterlab", root=None, autostart=False):
        s = Server(self, app, root or self.tmp / ("root-%d" % len(self.servers)), autostart=autostart)
        self.servers.append(s)
        return s

    def start_daemon(self, *extra):
        assert self.daemon is None
        self.daemon = Proc(
            [
                self.bin,
                "serve",
                "--runtime-dir",
                str(self.runtime),
                "--socket",
                str(self.socket),
                "--log-format=json",
                *extra,
            ],
            self.env,
            str(self.tmp / "gpumem.log"),
        )
        wait_for(
            "gpumem serve's socket",
            lambda: self.daemon_get("/healthz").status_code == 200,
            timeout=30,
        )

    def stop_daemon(self):
        if self.daemon:
            self.daemon.stop()
            self.daemon = None

    def daemon_get(self, path):
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://local-gpumem.sock",
            timeout=10,
            trust_env=False,
        ) as c:
            return c.get(path)

    def kernel_pid(self, kernel_id, timeout=120):
        """The kernel's pid as the daemon found it (the owner of its shell port)."""

        seen = {}

        def find():
            for k in self.daemon_get("/api/v1/kernels").json()["kernels"]:
                if k["kernel_id"] == kernel_id:
                    seen["last"] = k
                    if k["pid"] > 0 and k["alive"]:
                        return k["pid"]

        try:
            return wait_for(f"gpumem serve to follow kernel {kernel_id}", find, timeout=timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}; the daemon's last word on it: {seen.get('last', 'not listed')}") from None

    def close(self):
        self.stop_daemon()
        for s in self.servers:
            s.proc.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Marks a test whose call failed, so that its stack keeps the logs."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        item.gpumem_failed = True


@pytest.fixture
def stack(request):
    st = Stack(tempfile.mkdtemp(prefix="gpumem-ext-"))
    try:
        yield st
    finally:
        st.close()
        keep = bool(os.environ.get("GPUMEM_KEEP_TMP"))
        if getattr(request.node, "gpumem_failed", False):
            keep = keep_logs(st, request.node.name) or keep
        if not keep:
            shutil.rmtree(st.tmp, ignore_errors=True)


def keep_logs(st, test):
    """Prints the end of a failed test's daemon log (CI keeps only what is
    printed), copies its daemon and server logs to $GPUMEM_ARTIFACTS and
    says where. Without it they stay in the temp dir: True (keep it)."""
    daemon_log = st.tmp / "gpumem.log"
    if daemon_log.exists():
        print(f"\n{test}: the end of gpumem serve's log:\n" + daemon_log.read_text(errors="replace")[-6000:])
    dest = os.environ.get("GPUMEM_ARTIFACTS")
    if not dest:
        print(f"\n{test}: logs kept in {st.tmp}")
        return True
    out = Path(dest) / f"{test}-logs"
    out.mkdir(parents=True, exist_ok=True)
    for log in st.tmp.rglob("*.log"):
        shutil.copy(log, out / ("-".join(log.relative_to(st.tmp).parts)))
    print(f"\n{test}: logs in {out}")
    return False

"""The wheel as a user gets it: jupyterlab-gpumem's x86_64 wheel (from
scripts/build-wheels.sh, in dist/) pip-installed with JupyterLab at the
lock's version into a fresh virtualenv, and servers run from there with a
PATH that has no Go, npm or C compiler. The stack's parts (temp dirs, the
simulated GPU file, servers, logs kept on failure) are labextension/tests'
harness; the browser is Debian's chromium through .venv/current's
Playwright, which runs these tests."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "labextension" / "tests"))

from harness import Stack, keep_logs, need, pytest_runtest_makereport, simgpu, wait_for  # noqa: E402, F401  (the hook)

# What the servers and kernels may run besides the virtualenv's programs.
BASICS = ["sh", "bash", "env", "sleep", "cat", "kill", "ps", "setsid", "nohup", "true", "uname"]
# What a user of the wheel does not need, and so must not be on its PATH.
BUILD_TOOLS = ["go", "npm", "node", "gcc", "cc", "zig"]


def wheel_path(arch="x86_64"):
    """The wheel scripts/build-wheels.sh wrote for arch (GPUMEM_WHEEL_DIR, default dist/)."""
    d = Path(os.environ.get("GPUMEM_WHEEL_DIR", REPO / "dist"))
    found = sorted(d.glob(f"jupyterlab_gpumem-*-py3-none-manylinux_*_{arch}*.whl"))
    need(len(found) == 1, f"want one {arch} wheel in {d}, found {[p.name for p in found]}: run bash scripts/build-wheels.sh")
    return found[0]


class WheelEnv:
    """A fresh virtualenv with JupyterLab and the wheel, and the PATH to run it with."""

    def __init__(self, base):
        self.base = Path(base)
        self.venv = self.base / "venv"
        self.python = str(self.venv / "bin" / "python")
        self.gpumem = str(self.venv / "bin" / "gpumem")
        self.wheel = wheel_path()
        tools = self.base / "basics"
        tools.mkdir()
        for name in BASICS:
            found = shutil.which(name)
            if found:
                (tools / name).symlink_to(found)
        self.path = f"{self.venv / 'bin'}:{tools}"
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(self.venv)], check=True)
        pip = [self.python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["--require-hashes", "--no-deps", "-r", str(REPO / "requirements" / "wheel-test.txt")], check=True)
        subprocess.run(pip + ["--no-deps", str(self.wheel)], check=True)
        # Other users (JupyterHub's) may run from it too.
        self.base.chmod(self.base.stat().st_mode | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)

    def run(self, *argv, **kw):
        """Runs a program of the virtualenv with its PATH only."""
        env = dict(os.environ, PATH=self.path)
        env.update(kw.pop("env", {}))
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture(scope="session")
def wheel_env():
    base = tempfile.mkdtemp(prefix="gpumem-wheel-")
    try:
        yield WheelEnv(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def wstack(request, wheel_env):
    """A stack whose servers run from the wheel's virtualenv, and whose
    daemon (if a test starts one by hand) is the wheel's binary."""
    st = Stack(
        tempfile.mkdtemp(prefix="gpumem-wheel-test-"), python=wheel_env.python, bin=wheel_env.gpumem, env_path=wheel_env.path
    )
    try:
        yield st
    finally:
        st.close()
        # A daemon a failed test left: ended here (the passing tests prove
        # none is left).
        for pid in daemons(st.socket):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        keep = bool(os.environ.get("GPUMEM_KEEP_TMP"))
        if getattr(request.node, "gpumem_failed", False):
            log = st.runtime / "gpumem-serve.log"
            if log.exists():
                print(
                    f"\n{request.node.name}: the end of the autostarted daemon's log:\n" + log.read_text(errors="replace")[-6000:]
                )
            keep = keep_logs(st, request.node.name) or keep
        if not keep:
            shutil.rmtree(st.tmp, ignore_errors=True)


def _argv(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _zombie(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def daemons(socket):
    """The live `gpumem serve` processes for socket (their argv names it), sorted."""
    sock = str(socket).encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        argv = _argv(d)
        if len(argv) < 2 or not argv[0].endswith(b"gpumem") or argv[1] != b"serve":
            continue
        named = b"--socket=" + sock in argv or any(a == b"--socket" and b == sock for a, b in zip(argv, argv[1:]))
        if named and not _zombie(d):
            out.append(int(d))
    return sorted(out)


def alive(pid):
    return os.path.exists(f"/proc/{pid}") and not _zombie(pid)


def daemon_status(lab):
    """The server extension's word on the daemon (supervision.describe)."""
    return lab.state().get("daemon") or {}


def wait_case(lab, case, timeout=10, unless_pid=0):
    """Waits until lab says its daemon is in case (started, shared) with a
    pid other than unless_pid; returns the status."""

    def check():
        d = daemon_status(lab)
        return d if d.get("case") == case and d.get("pid") != unless_pid else None

    return wait_for(f"the server's daemon status to be {case}", check, timeout=timeout)


def wait_started(lab, timeout=10):
    """Waits until lab says the daemon it started serves it; returns the status."""
    return wait_case(lab, "started", timeout=timeout)


def server_log(lab):
    return Path(lab.proc.log).read_text(errors="replace")


def monotonic():
    return time.monotonic()


def built_binary(arch):
    """The binary scripts/build-wheels.sh built for arch (the wheel's)."""
    b = REPO / "build" / "wheel" / arch / "gpumem"
    need(b.exists(), f"{b} is missing: run bash scripts/build-wheels.sh")
    return b


def zig():
    """The zig of build-wheels.sh's tools virtualenv (GPUMEM_BUILD_TOOLS)."""
    tools = os.environ.get("GPUMEM_BUILD_TOOLS", "")
    found = sorted(Path(tools).glob("lib/python3*/site-packages/ziglang/zig")) if tools else []
    need(found, "GPUMEM_BUILD_TOOLS must name build-wheels.sh's tools virtualenv (with ziglang)")
    return str(found[0])


@pytest.fixture(scope="session")
def test_nvml(tmp_path_factory):
    """testdata/libnvidia-ml.c built for each arch: arch → its directory."""
    out = {}
    for arch in ("x86_64", "aarch64"):
        d = tmp_path_factory.mktemp("nvml-" + arch)
        subprocess.run(
            [
                zig(),
                "cc",
                "-target",
                f"{arch}-linux-gnu.2.17",
                "-shared",
                "-fPIC",
                "-o",
                str(d / "libnvidia-ml.so.1"),
                str(Path(__file__).parent / "testdata" / "libnvidia-ml.c"),
            ],
            check=True,
        )
        out[arch] = d
    return out


def simulated_gpu(pid, used_bytes, name="Simulated H200"):
    """The simulated-GPU file's text, with one process (the one Python
    writer, internal/testenv/simgpu.py, pinned to the Go one)."""
    return simgpu.document([simgpu.gpu(80 << 30, [simgpu.proc(pid, used_bytes)], name=name, uuid="GPU-0")])

"""hostkit's helpers, on this machine: a real jupyter_server (Debian's) started,
asked and stopped through Jupyter, a real kernel reached through
kernel_client, waits that time out, and nvidia-smi's queries read from a
stand-in nvidia-smi on PATH (no GPU here)."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostkit  # noqa: E402

# Debian's jupyter_server (1.23, as in the GPU host's kit); Debian's
# /usr/bin/jupyter has no `server` subcommand, so it starts as a module.
DEBIAN_PYTHON = "/usr/bin/python3"


def require(path, what):
    if os.path.exists(path):
        return
    if os.environ.get("CI") == "true":
        pytest.fail("%s not found at %s: install it (CI=true runs every test)" % (what, path))
    pytest.skip("%s not found at %s" % (what, path))


@pytest.fixture(autouse=True)
def no_failures_left():
    yield
    hostkit.FAILED.clear()


def test_result_and_check(capsys):
    hostkit.result("INFO", "a figure")
    hostkit.result("PASS", "one")
    assert hostkit.check(False, "two") is False
    assert hostkit.check(True, "three") is True
    assert capsys.readouterr().out == "INFO a figure\nPASS one\nFAIL two\nPASS three\n"
    assert hostkit.FAILED == ["two"]


def test_wait_returns_the_first_true_value():
    calls = []

    def cond():
        calls.append(1)
        return len(calls) >= 3 and {"n": len(calls)}

    assert hostkit.wait("three calls", cond, 10, every=0.01) == {"n": 3}


def test_wait_times_out():
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        hostkit.wait("nothing", lambda: None, 0.2)
    assert time.monotonic() - t0 >= 0.2
    assert str(e.value) == "FAIL timed out after 0.2s waiting for nothing"
    # A caller that goes on after a timeout asks for an exception it catches.
    for exc in (TimeoutError, RuntimeError):
        with pytest.raises(exc) as e:
            hostkit.wait("a zero", lambda: 0, 0.1, every=0.02, raises=exc)
        assert str(e.value) == "timed out after 0.1s waiting for a zero"


def test_timing_phases():
    phases = {"total": [1.0]}
    stderr = "a warning\ngpumem timing: nvml_open=0.50ms discover=1.25ms total=2.00ms\n"
    hostkit.timing_phases(stderr, phases)
    hostkit.timing_phases("", phases)
    assert phases == {"total": [1.0, 2.0], "nvml_open": [0.5], "discover": [1.25]}


FAKE_SMI = r"""#!/bin/sh
# Stands in for nvidia-smi: its arguments go to $SMI_ARGS; prints what the
# query asks for.
echo "$*" >> "$SMI_ARGS"
case "$1" in
  -L) printf 'GPU 0: NVIDIA H200 (UUID: GPU-a)\n  MIG 1g.18gb Device 0: (UUID: MIG-x)\nGPU 1: NVIDIA H200 (UUID: GPU-b)\n' ;;
  --query-compute-apps=gpu_uuid,pid,used_memory) printf 'GPU-a, 100, 2048\nGPU-b, 100, 512\nGPU-b, 200, 1024\n' ;;
  --query-compute-apps=pid) printf '100\n100\n200\n' ;;
  --query-gpu=memory.free) printf '143000\n' ;;
  --fail) echo "NVIDIA-SMI has failed" ; exit 9 ;;
esac
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    args = tmp_path / "args"
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    monkeypatch.setenv("SMI_ARGS", str(args))
    return args


def test_nvidia_smi_queries(fake_smi):
    assert hostkit.compute_apps() == {("GPU-a", 100): 2048, ("GPU-b", 100): 512, ("GPU-b", 200): 1024}
    assert hostkit.smi() == {100: 2560, 200: 1024}
    assert hostkit.gpus() == ["GPU 0: NVIDIA H200 (UUID: GPU-a)", "GPU 1: NVIDIA H200 (UUID: GPU-b)"]
    assert hostkit.gpu_count() == 2
    assert hostkit.smi_rows("--query-gpu=memory.free", "-i", "0") == [["143000"]]
    assert hostkit.smi_rows("--query-compute-apps=pid") == [["100"], ["100"], ["200"]]
    assert "--query-gpu=memory.free -i 0 --format=csv,noheader,nounits" in fake_smi.read_text().splitlines()


def test_nvidia_smi_failure(fake_smi):
    # Read as it is by default (nothing to parse), an error with check.
    assert hostkit.smi_rows("--fail") == [["NVIDIA-SMI has failed"]]
    with pytest.raises(subprocess.CalledProcessError) as e:
        hostkit.smi_rows("--fail", check=True)
    assert e.value.returncode == 9


def test_serve_and_stop(tmp_path):
    # serve's command line, as a stand-in binary sees it.
    binary = tmp_path / "gpumem"
    binary.write_text('#!/bin/sh\necho "$@" >&2\n')
    binary.chmod(0o755)
    log = tmp_path / "serve.log"
    p = hostkit.serve(str(binary), str(log), "--interval=1s", "--no-notebook-alerts")
    assert p.wait(timeout=30) == 0
    assert log.read_text() == "serve --log-format=json --interval=1s --no-notebook-alerts\n"

    # stop: SIGTERM first; one that ignores it is killed after the timeout.
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout.readline() == "ready\n"
    t0 = time.monotonic()
    hostkit.stop(polite, stubborn, timeout=1)
    took = time.monotonic() - t0
    assert polite.wait(timeout=10) == -signal.SIGTERM
    assert stubborn.wait(timeout=10) == -signal.SIGKILL
    assert 1 <= took < 10
    stubborn.stdout.close()


def test_jupyter_server_api_and_kernel(tmp_path, monkeypatch):
    require(DEBIAN_PYTHON, "Debian's Python with jupyter_server")
    for var in ("JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "IPYTHONDIR"):
        d = tmp_path / var.lower()
        d.mkdir()
        monkeypatch.setenv(var, str(d))
    root = tmp_path / "notebooks"
    (root / "team").mkdir(parents=True)
    (root / "team" / "train.ipynb").write_text('{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}')
    log = tmp_path / "jupyter.log"
    server = hostkit.Jupyter(
        str(log),
        ["--allow-root", "--no-browser", "--ServerApp.root_dir=" + str(root)],
        cmd=(DEBIAN_PYTHON, "-m", "jupyter_server"),
    )
    try:
        hostkit.wait("jupyter server", server.up, 60, raises=TimeoutError)
        assert server.up()["started"]
        listed = server.api("GET", "api/contents/team")
        assert [c["name"] for c in listed["content"]] == ["train.ipynb"]

        # The token is what lets a request in.
        token, server.token = server.token, "not-" + server.token
        try:
            with pytest.raises(urllib.error.HTTPError) as e:
                server.api("GET", "api/contents/team")
            assert e.value.code == 403
            assert server.up() is None
        finally:
            server.token = token

        # A notebook's session and its kernel, reached by its connection file.
        kid, kc = hostkit.start_kernel(server.api, "team/train.ipynb")
        sessions = server.api("GET", "api/sessions")
        assert [(x["path"], x["name"], x["kernel"]["id"]) for x in sessions] == [("team/train.ipynb", "train.ipynb", kid)]
        try:
            content, text = hostkit.run_cell(kc, "print(6 * 7)", 60)
            assert (content["status"], text) == ("ok", "42\n")
            content, text = hostkit.run_cell(kc, "print('before'); 1 / 0", 60)
            assert (content["status"], content["ename"], text) == ("error", "ZeroDivisionError", "before\n")
            # No GPU here: the cell that holds CUDA memory fails, and ends
            # the script with a FAIL line.
            with pytest.raises(SystemExit) as e:
                hostkit.hold_with_child(kc, kid)
            assert str(e.value).startswith("FAIL kernel code: {")
            assert "'status': 'error'" in str(e.value)
        finally:
            kc.stop_channels()
        # A second client of the same kernel, by its id.
        kc = hostkit.connect(kid)
        try:
            assert hostkit.run_cell(kc, "import os; print(os.getpid() > 0)", 60)[1] == "True\n"
        finally:
            kc.stop_channels()
        assert server.api("DELETE", "api/kernels/" + kid) is None
        assert kid not in {k["id"] for k in server.api("GET", "api/kernels")}
        # A kernel whose connection file never comes: the wait ends it.
        t0 = time.monotonic()
        with pytest.raises(SystemExit, match="^FAIL timed out after 0.5s waiting for connection file of none$"):
            hostkit.connect("none", "connection file of none", timeout=0.5)
        assert time.monotonic() - t0 >= 0.5
    finally:
        server.stop()
    assert server.proc.poll() is not None
    assert server.up() is None
    assert "Jupyter Server" in log.read_text()


def test_kernel_client_gives_up(tmp_path):
    # A connection file whose kernel never answers: it tries again until its
    # deadline, then the error comes out.
    cf = tmp_path / "kernel-none.json"
    cf.write_text(
        json.dumps(
            {
                "ip": "127.0.0.1",
                "transport": "tcp",
                "shell_port": 1,
                "iopub_port": 2,
                "stdin_port": 3,
                "control_port": 4,
                "hb_port": 5,
                "key": "k",
                "signature_scheme": "hmac-sha256",
            }
        )
    )
    t0 = time.monotonic()
    with pytest.raises((RuntimeError, TimeoutError)):
        hostkit.kernel_client(str(cf), timeout=1)
    assert time.monotonic() - t0 < 60

"""`gpumem demo` as a pip user without a GPU runs it: the wheel's gpumem
starts the JupyterLab installed beside it, whose extension starts the
daemon; the example notebook's kernel holds 3 GiB of the simulated GPU,
and the banner says where everything is. Ctrl-C stops JupyterLab, its
kernel and its daemon, and the demo's temporary dir goes with them."""

import ctypes.util
import json
import os
import signal
import subprocess
import threading
import urllib.request

from conftest import alive, daemons
from harness import GiB, free_port, wait_for


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_demo_as_a_pip_user_gets_it(wheel_env, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    port = free_port()
    argv = [wheel_env.gpumem, "demo", f"--port={port}"]
    if ctypes.util.find_library("nvidia-ml"):
        argv.append("--simulated")  # this test is of the machine without a GPU
    env = dict(os.environ, PATH=wheel_env.path, TMPDIR=str(tmp))
    for k in ("JUPYTER_RUNTIME_DIR", "GPUMEM_FAKE_GPU", "GPUMEM_SOCKET"):
        env.pop(k, None)
    p = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    lines, runtime = [], None
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    try:
        wait_for(
            "gpumem demo's banner",
            lambda: any(line.startswith("Stop:") for line in lines) or p.poll() is not None,
            timeout=180,
        )
        out = "".join(lines)
        assert p.poll() is None, f"gpumem demo exited {p.returncode}:\n{out}"
        print(out)
        assert "on a simulated GPU (no NVIDIA driver here)" in out, out
        url = next(line.split()[1] for line in lines if line.startswith("JupyterLab:"))
        assert url.startswith(f"http://127.0.0.1:{port}/lab/tree/leaks.ipynb?token="), out
        runtime = next(line.split("=", 1)[1].split()[0] for line in lines if line.startswith("In a shell:"))
        demo_dir = os.path.dirname(runtime)
        # In TMPDIR, unless the daemon's socket would not fit a unix
        # socket's 107 bytes there (pytest's dirs are deep): then in /tmp.
        fits = len(os.path.join(str(tmp), "gpumem-demo-0123456789", "runtime", "gpumem.sock")) <= 107
        want_parent = str(tmp) if fits else "/tmp"
        assert os.path.dirname(demo_dir) == want_parent, f"the demo's dir {demo_dir} is not a new one in {want_parent}"
        assert len(os.path.join(runtime, "gpumem.sock")) <= 107, f"the daemon's socket in {runtime} cannot be listened on"
        # The page the banner names opens with its token.
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200

        # The figure, as the user's shell sees it through the daemon.
        ls = wheel_env.run(wheel_env.gpumem, "ls", "--json", env={"JUPYTER_RUNTIME_DIR": runtime})
        assert ls.returncode == 0, ls.stderr
        rep = json.loads(ls.stdout)
        (nb,) = [n for n in rep["notebooks"] if n.get("notebook", "").endswith("leaks.ipynb")]
        assert nb["gpu_memory_bytes"] == 3 * GiB, nb
        assert rep["gpus"][0]["simulated"] is True, rep["gpus"]
        kernel = nb["pids"][0]
        socket = os.path.join(runtime, "gpumem.sock")
        (daemon,) = daemons(socket)

        # Ctrl-C, as a terminal sends it to the demo's process group.
        os.killpg(p.pid, signal.SIGINT)
        wait_for("gpumem demo to exit", lambda: p.poll() is not None, timeout=60)
        assert p.returncode == 0, "".join(lines)
        wait_for("the example's kernel to end with JupyterLab", lambda: not alive(kernel), timeout=30)
        wait_for("the daemon to leave with JupyterLab", lambda: not alive(daemon), timeout=30)
        assert not os.path.exists(demo_dir), "the demo left its temporary dir"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        # JupyterLab runs in a process group of its own: a failed test ends it too.
        for name in os.listdir(runtime) if runtime and os.path.isdir(runtime) else []:
            if name.startswith("jpserver-") and name.endswith(".json"):
                try:
                    os.killpg(int(name[len("jpserver-") : -len(".json")]), signal.SIGKILL)
                except (ValueError, ProcessLookupError, PermissionError):
                    pass

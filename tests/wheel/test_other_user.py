"""Each user's server gets that user's daemon, as each JupyterHub
single-user server does (LocalProcessSpawner runs it as the user, with the
user's default runtime dir): root's server and a real second account's
(useradd) each start their own `gpumem serve`, running as their own uid on
their own runtime dir; stopping the user's server ends the user's daemon
only."""

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import alive, daemons, wait_started
from harness import free_port, need, wait_for


@pytest.fixture
def account():
    need(os.geteuid() == 0, "this test makes a real user account (useradd): run it as root")
    name = "gw" + secrets.token_hex(3)
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        uid = pwd.getpwnam(name).pw_uid
        for d in os.listdir("/proc"):
            if d.isdigit() and uid_of(d) == uid:
                try:
                    os.kill(int(d), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        wait_for(
            "the test user's processes to end",
            lambda: not [d for d in os.listdir("/proc") if d.isdigit() and uid_of(d) == uid],
            15,
        )
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


def uid_of(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except OSError:
        return None


def test_each_users_server_starts_that_users_daemon(wstack, wheel_env, account):
    root_lab = wstack.server(autostart=True)
    root_daemon = wait_started(root_lab)["pid"]

    # The user's server: as the user, with the user's home and default
    # runtime dir, the wheel's virtualenv and PATH, the simulated GPU.
    port, token = free_port(), secrets.token_hex(16)
    # The simulated GPU file, readable by the user (its dir: only passable).
    os.chmod(wstack.tmp, 0o711)
    os.chmod(wstack.gpus_file, 0o644)
    env = {
        "HOME": account.pw_dir,
        "USER": account.pw_name,
        "PATH": wheel_env.path,
        "GPUMEM_FAKE_GPU": str(wstack.gpus_file),
        "LANG": "C.UTF-8",
    }
    log = open(wstack.tmp / "user-server.log", "wb")
    argv = [shutil.which("setpriv"), f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--",
            wheel_env.python, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={account.pw_dir}"]  # fmt: skip
    user_server = subprocess.Popen(
        argv, env=env, cwd=account.pw_dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{port}/"

        def state():
            return httpx.get(url + "gpumem/api/v1/state", headers={"Authorization": "token " + token}, timeout=10).json()

        d = wait_for(
            "the user's server to start its daemon",
            lambda: (lambda s: s if s.get("case") == "started" else None)(state().get("daemon") or {}),
            60,
        )
        assert d["user"] == account.pw_name, d
        runtime = Path(account.pw_dir, ".local", "share", "jupyter", "runtime")
        assert daemons(runtime / "gpumem.sock") == [d["pid"]]
        assert uid_of(d["pid"]) == account.pw_uid, "the user's daemon runs as the user"
        assert uid_of(root_daemon) == 0 and daemons(wstack.socket) == [root_daemon], "root's daemon is root's, on root's dir"
        assert (runtime / "gpumem-serve.log").exists()

        user_server.send_signal(signal.SIGTERM)
        user_server.wait(60)
        wait_for("the user's daemon to leave with the user's server", lambda: not alive(d["pid"]), 30)
        time.sleep(0.5)  # a moment for a wrong stop to show: root's daemon must still be there
        assert alive(root_daemon) and daemons(wstack.socket) == [root_daemon]
    finally:
        if user_server.poll() is None:
            os.killpg(user_server.pid, signal.SIGKILL)
        user_server.wait(30)

"""pip install -U while the servers run: a server restarts the daemon it
started when the binary on disk is now another version, and never a daemon
it did not start. The newer version is this tree with another number in
package.json (the binary built with a go overlay, the wheel by hatch from a
copy of labextension/)."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO, alive, daemons, server_log, wait_case, wait_started
from harness import need

NEW = "9.9.9"


@pytest.fixture(scope="module")
def newer_wheel(tmp_path_factory):
    tools = os.environ.get("GPUMEM_BUILD_TOOLS", "")
    need(
        tools and os.path.exists(os.path.join(tools, "bin", "python")),
        "GPUMEM_BUILD_TOOLS must name build-wheels.sh's tools virtualenv",
    )
    need(shutil.which("go"), "go builds the newer binary")
    tmp = tmp_path_factory.mktemp("upgrade")
    pkg = json.loads((REPO / "labextension" / "package.json").read_text())
    pkg["version"] = NEW
    (tmp / "package.json").write_text(json.dumps(pkg, indent=2))
    (tmp / "overlay.json").write_text(
        json.dumps({"Replace": {str(REPO / "labextension" / "package.json"): str(tmp / "package.json")}})
    )
    binary = tmp / "gpumem"
    subprocess.run(
        [
            "go",
            "build",
            "-overlay",
            str(tmp / "overlay.json"),
            "-ldflags=-X github.com/gpumem/gpumem.commit=upgradetest",
            "-o",
            str(binary),
            "./cmd/gpumem",
        ],
        cwd=REPO,
        check=True,
        env=dict(os.environ, CGO_CFLAGS="-O2 -Wno-deprecated-declarations"),
    )
    src = tmp / "labextension"
    shutil.copytree(
        REPO / "labextension", src, ignore=shutil.ignore_patterns("node_modules", "dist", "lib", "tests", "__pycache__")
    )
    shutil.copy(tmp / "package.json", src / "package.json")
    subprocess.run(
        [
            os.path.join(tools, "bin", "python"),
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp),
        ],
        cwd=src,
        check=True,
        env=dict(os.environ, GPUMEM_WHEEL_BINARY=str(binary), GPUMEM_WHEEL_PLATFORM="linux_x86_64"),
    )
    return next(tmp.glob(f"jupyterlab_gpumem-{NEW}-*.whl"))


def pip_install(wheel_env, wheel, *flags):
    r = wheel_env.run(
        wheel_env.python, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", *flags, str(wheel)
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def restore(wheel_env):
    """Puts the wheel under test back into the session's virtualenv after."""
    yield
    pip_install(wheel_env, wheel_env.wheel, "--force-reinstall")


def test_upgrade_restarts_the_daemon_this_server_started(wstack, wheel_env, newer_wheel, restore):
    lab = wstack.server(autostart=True)
    old = wait_started(lab)
    assert old["version"] != NEW
    pip_install(wheel_env, newer_wheel, "-U")
    new = wait_case(lab, "started", timeout=15, unless_pid=old["pid"])
    assert new["version"] == NEW and new["commit"] == "upgradetest", new
    assert not alive(old["pid"])
    assert daemons(wstack.socket) == [new["pid"]]
    assert f"is now gpumem {NEW} (commit upgradetest)" in server_log(lab)


def test_upgrade_never_restarts_a_daemon_it_did_not_start(wstack, wheel_env, newer_wheel, restore):
    wstack.start_daemon()
    hand = wstack.daemon.p.pid
    lab = wstack.server(autostart=True)
    assert wait_case(lab, "shared")["pid"] == hand
    pip_install(wheel_env, newer_wheel, "-U")
    # A server that owned the daemon restarts it within a check or two;
    # watch for five.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert alive(hand) and daemons(wstack.socket) == [hand], "the daemon started by hand was stopped or doubled"
        time.sleep(0.2)  # sampling over a window, not waiting for a state
    assert (lab.state().get("daemon") or {}).get("pid") == hand
    assert "is now gpumem" not in server_log(lab)
    assert not Path(wstack.runtime / "gpumem-serve.log").exists()

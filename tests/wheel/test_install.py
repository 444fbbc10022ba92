"""pip install of the wheel into a fresh virtualenv: the binary on PATH
prints the wheel's version, JupyterLab and jupyter_server list the
extensions enabled, and the PATH holds no build tool."""

import re
import shutil
import zipfile

from conftest import BUILD_TOOLS


def test_no_build_tool_on_the_path(wheel_env):
    found = {t: shutil.which(t, path=wheel_env.path) for t in BUILD_TOOLS}
    assert not any(found.values()), f"build tools on the wheel's PATH: {found}"
    assert shutil.which("gpumem", path=wheel_env.path) == wheel_env.gpumem


def test_gpumem_version_is_the_wheels(wheel_env):
    wheel_version = re.match(r"jupyterlab_gpumem-([^-]+)-", wheel_env.wheel.name).group(1)
    r = wheel_env.run("gpumem", "version")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(rf"gpumem {re.escape(wheel_version)} \(commit [0-9a-f]{{12}}(-dirty)?\)\n", r.stdout), r.stdout
    r = wheel_env.run(wheel_env.python, "-c", "import jupyterlab_gpumem; print(jupyterlab_gpumem.__version__)")
    assert r.stdout.strip() == wheel_version, r


def test_the_binary_is_the_wheels_and_no_nvml_is_inside(wheel_env):
    with zipfile.ZipFile(wheel_env.wheel) as z:
        names = z.namelist()
        inside = z.read(next(n for n in names if n.endswith(".data/scripts/gpumem")))
    assert not [n for n in names if "nvidia-ml" in n or n.endswith(".so") or ".so." in n], names
    with open(wheel_env.gpumem, "rb") as f:
        assert f.read() == inside, "venv/bin/gpumem is not the wheel's binary"


def plain(text):
    """Without the terminal colours jupyter puts around "enabled" and "OK"."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_jupyter_lists_both_extensions_enabled(wheel_env):
    r = wheel_env.run(wheel_env.python, "-m", "jupyter", "labextension", "list")
    out = plain(r.stdout + r.stderr)
    assert re.search(r"jupyterlab-gpumem v\S+ enabled.*OK", out), out
    r = wheel_env.run(wheel_env.python, "-m", "jupyter", "server", "extension", "list")
    out = plain(r.stdout + r.stderr)
    assert re.search(r"jupyterlab_gpumem enabled", out), out
    assert re.search(r"jupyterlab_gpumem \S+ OK", out), out


def test_pip_check(wheel_env):
    r = wheel_env.run(wheel_env.python, "-m", "pip", "check")
    assert r.returncode == 0, r.stdout + r.stderr

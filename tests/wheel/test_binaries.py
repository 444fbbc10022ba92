"""The binaries inside the wheels: the glibc symbol versions they need
(listed, and none newer than 2.17), the libraries they link (glibc's only:
libnvidia-ml is not among them), and NVML loaded at run time: without a
driver the binary starts and says so; with a libnvidia-ml.so.1 on the
library path it finds the GPU there."""

import os
import re
import subprocess

import pytest
from conftest import built_binary

GLIBC_LIBS = {"libc.so.6", "libpthread.so.0", "libdl.so.2", "libresolv.so.2", "libm.so.6", "librt.so.1"}


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_glibc_symbol_versions_and_libraries(arch):
    b = built_binary(arch)
    versions = sorted(
        set(re.findall(r"Name: GLIBC_([0-9.]+)", readelf("-V", str(b)))), key=lambda v: tuple(map(int, v.split(".")))
    )
    print(f"{arch}: GLIBC symbol versions needed: {', '.join(versions)}")
    assert versions, "no GLIBC version needed: is this the dynamically linked binary?"
    assert max(tuple(map(int, v.split("."))) for v in versions) <= (2, 17), versions
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", str(b))))
    print(f"{arch}: links {sorted(needed)}")
    assert needed and needed <= GLIBC_LIBS, needed
    dynamic = readelf("-d", str(b))
    lazy = not re.search(r"BIND_NOW|FLAGS_1.*\bNOW\b", dynamic)
    assert lazy, "NVML's functions must bind lazily: the binary starts without a driver"


def test_nvml_is_loaded_at_run_time(test_nvml):
    b = str(built_binary("x86_64"))
    env = {k: v for k, v in os.environ.items() if k not in ("GPUMEM_FAKE_GPU", "LD_LIBRARY_PATH")}
    # No driver: it starts, says so in one line, and lists nothing.
    r = subprocess.run([b, "ls"], capture_output=True, text=True, env=dict(env, LD_LIBRARY_PATH="/nonexistent"), timeout=60)
    if "Test NVML GPU" in r.stdout:
        pytest.fail("a libnvidia-ml was found without the test's")
    if os.path.exists("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"):
        pytest.skip("this machine has an NVIDIA driver: the no-driver case cannot be seen here")
    assert r.returncode == 0 and "no NVIDIA driver found (libnvidia-ml.so.1)" in r.stderr, r
    # The test's library: its GPU, through functions resolved at run time.
    r = subprocess.run(
        [b, "ls"], capture_output=True, text=True, env=dict(env, LD_LIBRARY_PATH=str(test_nvml["x86_64"])), timeout=60
    )
    assert r.returncode == 0, r
    assert "GPU 0  Test NVML GPU  7.0 GiB / 80.0 GiB used" in r.stdout, r.stdout

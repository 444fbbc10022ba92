"""The aarch64 binary under qemu-aarch64 (Debian's qemu-user) with
Debian's arm64 glibc (libc6-arm64-cross): `gpumem version`, `gpumem ls`
with the simulated GPU, and NVML loaded at run time from an arm64
libnvidia-ml.so.1."""

import os
import shutil
import subprocess

from conftest import built_binary, simulated_gpu
from harness import need

SYSROOT = "/usr/aarch64-linux-gnu"


def qemu(*argv, env=None):
    q = shutil.which("qemu-aarch64")
    need(
        q and os.path.exists(SYSROOT + "/lib/ld-linux-aarch64.so.1"),
        "qemu-aarch64 and libc6-arm64-cross are needed (tests/wheel/test.sh installs them)",
    )
    e = [a for k, v in (env or {}).items() for a in ("-E", f"{k}={v}")]
    return subprocess.run([q, "-L", SYSROOT, *e, *argv], capture_output=True, text=True, timeout=120)


def test_version_ls_and_nvml_under_qemu(tmp_path, test_nvml):
    b = str(built_binary("aarch64"))
    machine = subprocess.run(["readelf", "-h", b], capture_output=True, text=True, check=True).stdout
    assert "AArch64" in machine, machine
    r = qemu(b, "version")
    assert r.returncode == 0 and r.stdout.startswith("gpumem "), r
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "gpus.json").write_text(simulated_gpu(sleeper.pid, 2 << 30, name="Simulated GH200"))
        r = qemu(b, "ls", env={"GPUMEM_FAKE_GPU": str(tmp_path / "gpus.json")})
        assert r.returncode == 0, r
        assert "Simulated GH200 (simulated)  2.0 GiB / 80.0 GiB used" in r.stdout and "other: sleep 60" in r.stdout, r.stdout
    finally:
        sleeper.kill()
        sleeper.wait()
    r = qemu(b, "ls", env={"LD_LIBRARY_PATH": str(test_nvml["aarch64"])})
    assert r.returncode == 0 and "GPU 0  Test NVML GPU  7.0 GiB / 80.0 GiB used" in r.stdout, r

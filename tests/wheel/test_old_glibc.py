"""The x86_64 binary on an older userland: Debian 11 (bullseye, glibc
2.31), a debootstrap chroot tests/wheel/test.sh makes and caches
(GPUMEM_CHROOT_BULLSEYE). Older suites (buster's glibc 2.28) are no longer
on Debian's mirror; the symbol check (test_binaries.py) covers down to
2.17. A Debian 12 binary fails there, so the chroot does test something."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from conftest import built_binary, simulated_gpu
from harness import need


def chroot_root():
    root = os.environ.get("GPUMEM_CHROOT_BULLSEYE", "")
    need(
        root and (Path(root) / "etc" / "debian_version").exists(),
        "GPUMEM_CHROOT_BULLSEYE must name a bullseye chroot (tests/wheel/test.sh makes it)",
    )
    need(os.geteuid() == 0, "chroot needs root")
    return Path(root)


def in_chroot(root, script):
    """Runs script with /bin/sh in root, in new pid and mount namespaces (its own /proc)."""
    return subprocess.run(
        ["unshare", "--pid", "--fork", f"--mount-proc={root}/proc", "chroot", str(root), "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_version_and_ls_on_glibc_2_31(test_nvml):
    root = chroot_root()
    d = Path(tempfile.mkdtemp(dir=root / "tmp", prefix="gpumem-"))
    try:
        shutil.copy(built_binary("x86_64"), d / "gpumem")
        shutil.copy(test_nvml["x86_64"] / "libnvidia-ml.so.1", d / "libnvidia-ml.so.1")
        shutil.copy("/usr/bin/true", d / "debian12-true")
        inner = "/" + str(d.relative_to(root))
        # The simulated GPU lists a process of the chroot's own pid namespace.
        gpu = simulated_gpu(0, 3 << 30).replace('"pid":0', '"pid":%d')
        script = "\n".join(
            [
                "set -e",
                "ldd --version | head -1",
                f"{inner}/gpumem version",
                "sleep 60 & s=$!",
                f"printf '{gpu}' \"$s\" > {inner}/gpus.json",
                f"GPUMEM_FAKE_GPU={inner}/gpus.json {inner}/gpumem ls",
                f"LD_LIBRARY_PATH={inner} {inner}/gpumem ls",
                'kill "$s"',
                f'{inner}/debian12-true 2>&1 || echo "debian12-true failed"',
            ]
        )
        r = in_chroot(root, script)
        out = r.stdout + r.stderr
        print(out)
        assert r.returncode == 0, out
        assert "GLIBC 2.31" in out or ") 2.31" in out, out
        assert "gpumem 0." in out or "gpumem 1." in out
        assert "Simulated H200 (simulated)  3.0 GiB / 80.0 GiB used" in out, out
        assert "other: sleep 60" in out and "3.0 GiB" in out, out
        assert "GPU 0  Test NVML GPU  7.0 GiB / 80.0 GiB used" in out, out
        assert "GLIBC_2.34' not found" in out and "debian12-true failed" in out, (
            "a Debian 12 binary ran: the chroot's glibc is not old"
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)

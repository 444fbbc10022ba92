"""The wheel's figures for BENCHMARKS.md, each beside a reference measured in
the same run:

- the wheels' sizes (dist/, from scripts/build-wheels.sh);
- an offline `pip install` of the x86_64 wheel into a virtualenv that has
  JupyterLab (requirements/wheel-test.txt), against the same install of the
  pure wheel (no binary) that labextension/scripts/build.sh makes;
- `gpumem version`'s start time, against /bin/true;
- what the server extension adds to JupyterLab's start: from launch until
  /api/status answers, with the extension (its daemon started) and the same
  server with it disabled (--ServerApp.jpserver_extensions), alternating; and
  from launch until the daemon it started serves.

Run with .venv/current's Python after scripts/build-wheels.sh:
  GPUMEM_BUILD_TOOLS=~/.cache/gpumem/build-tools-<hash> \
    .venv/current/bin/python scripts/bench_wheel.py [--runs N] > docs/benchmarks/wheel.txt
"""

import argparse
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def median_ms(samples):
    return "%.1f ms (min %.1f, max %.1f, n=%d)" % (
        statistics.median(samples) * 1e3,
        min(samples) * 1e3,
        max(samples) * 1e3,
        len(samples),
    )


def timed(argv, **kw):
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU of pid so far (/proc/<pid>/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lab_start(python, tmp, with_extension):
    """Seconds from launch to /api/status answering, the server's CPU
    seconds by then, and seconds to the daemon its extension started serving
    (None without the extension)."""
    port, token = free_port(), secrets.token_hex(8)
    run = Path(tempfile.mkdtemp(dir=tmp))
    (run / "runtime").mkdir(mode=0o700)
    env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(run / "runtime"),
        JUPYTER_CONFIG_DIR=str(run / "cfg"),
        JUPYTER_DATA_DIR=str(run / "data"),
    )
    env.pop("GPUMEM_SOCKET", None)
    argv = [
        python,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={run}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if not with_extension:
        argv.append("--ServerApp.jpserver_extensions={'jupyterlab_gpumem': False}")
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=run)
    up = served = None
    try:
        deadline = t0 + 120
        while time.perf_counter() < deadline:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/api/status", headers={"Authorization": "token " + token})
                urllib.request.urlopen(req, timeout=2).read()
                up = time.perf_counter() - t0
                cpu = cpu_seconds(p.pid)
                break
            except OSError:
                time.sleep(0.02)
        sock = run / "runtime" / "gpumem.sock"
        while with_extension and time.perf_counter() < deadline:
            if sock.exists():
                with socket.socket(socket.AF_UNIX) as s:
                    try:
                        s.connect(str(sock))
                        served = time.perf_counter() - t0
                        break
                    except OSError:
                        pass
            time.sleep(0.02)
    finally:
        os.killpg(p.pid, 15)
        p.wait(30)
        # The daemon leaves after its server: wait for its socket to go.
        sock = run / "runtime" / "gpumem.sock"
        end = time.perf_counter() + 30
        while sock.exists() and time.perf_counter() < end:
            time.sleep(0.05)
    if up is None:
        sys.exit("JupyterLab did not answer within 120 s")
    return up, cpu, served


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    wheels = sorted((REPO / "dist").glob("jupyterlab_gpumem-*-manylinux_*.whl"))
    x86 = [w for w in wheels if w.name.endswith("x86_64.whl")]
    if not x86:
        sys.exit("no x86_64 wheel in dist/: run bash scripts/build-wheels.sh")
    print("gpumem wheel figures,", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, load {os.getloadavg()[0]:.1f}")
    print(f"command: .venv/current/bin/python scripts/bench_wheel.py --runs {args.runs}")
    print()
    for w in wheels:
        print(f"size: {w.name}: {w.stat().st_size / 1e6:.2f} MB ({w.stat().st_size} bytes)")

    tmp = Path(tempfile.mkdtemp(prefix="gpumem-bench-wheel-"))
    try:
        venv = tmp / "venv"
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run(pip + ["--require-hashes", "--no-deps", "-r", str(REPO / "requirements" / "wheel-test.txt")], check=True)
        # The reference: the same package without the binary (the pure wheel
        # labextension/scripts/build.sh makes), built with build-wheels.sh's tools.
        tools = os.environ.get("GPUMEM_BUILD_TOOLS", "")
        if not tools:
            sys.exit("GPUMEM_BUILD_TOOLS must name build-wheels.sh's tools virtualenv (~/.cache/gpumem/build-tools-*)")
        pure_dir = tmp / "pure"
        env = {k: v for k, v in os.environ.items() if k != "GPUMEM_WHEEL_BINARY"}
        subprocess.run(
            [
                os.path.join(tools, "bin", "python"),
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(pure_dir),
                ".",
            ],
            check=True,
            env=env,
            cwd=REPO / "labextension",
        )
        ref_wheel = next(pure_dir.glob("*-py3-none-any.whl"))
        offline = pip + ["--no-index", "--no-deps", "--force-reinstall", "--no-compile"]
        wheel_t, ref_t = [], []
        for _ in range(args.runs):
            wheel_t.append(timed(offline + [str(x86[0])]))
            ref_t.append(timed(offline + [str(ref_wheel)]))
        print()
        print(f"offline pip install of {x86[0].name} (into a virtualenv with JupyterLab): {median_ms(wheel_t)}")
        ratio = statistics.median(wheel_t) / statistics.median(ref_t)
        print(f"  reference, the pure wheel without the binary: {median_ms(ref_t)}; ratio {ratio:.2f}")
        subprocess.run(offline + [str(x86[0])], check=True)
        gpumem = str(venv / "bin" / "gpumem")

        v_t, true_t = [], []
        for _ in range(max(50, args.runs * 10)):
            v_t.append(timed([gpumem, "version"]))
            true_t.append(timed(["/bin/true"]))
        print()
        print(f"gpumem version, wall per run: {median_ms(v_t)}")
        print(
            f"  reference, /bin/true: {median_ms(true_t)}; gpumem version takes {statistics.median(v_t) - statistics.median(true_t):.4f} s more"
        )

        with_up, with_cpu, served, without_up, without_cpu = [], [], [], [], []
        for _ in range(args.runs):
            up, cpu, srv = lab_start(py, tmp, True)
            with_up.append(up)
            with_cpu.append(cpu)
            served.append(srv)
            up, cpu, _ = lab_start(py, tmp, False)
            without_up.append(up)
            without_cpu.append(cpu)
        print()
        print(f"JupyterLab start (launch to /api/status answering), with jupyterlab-gpumem: {median_ms(with_up)}")
        print(f"  the same server with the extension disabled: {median_ms(without_up)}")
        print(
            f"  the extension adds {statistics.median(with_up) - statistics.median(without_up):+.3f} s (ratio {statistics.median(with_up) / statistics.median(without_up):.3f})"
        )
        print(f"  the server's CPU by then: {median_ms(with_cpu)} with, {median_ms(without_cpu)} without")
        extra = statistics.median(with_cpu) - statistics.median(without_cpu)
        print(
            f"  the extension adds {extra:+.3f} s of the server's CPU (ratio {statistics.median(with_cpu) / statistics.median(without_cpu):.3f})"
        )
        print(f"  launch to the daemon it started serving its socket: {median_ms([s for s in served if s is not None])}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

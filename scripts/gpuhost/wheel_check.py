#!/usr/bin/env python3
"""wheel_check.py: jupyterlab-gpumem, pip-installed on the GPU host, end to
end (run by scripts/gpuhost/wheel_check.sh, which installs it and sets the
environment):

  1. `jupyter server` (jupyter_server 2) starts with no gpumem daemon and no
     simulated GPU; the extension starts `gpumem serve` by itself (the
     binary pip put on PATH), and says so (daemon case "started");
  2. a kernel holds a 2 GiB torch tensor on cuda:0 and a child of it (in a
     session of its own) 1 GiB: the extension's per-notebook figures
     (GET gpumem/api/v1/state, what the panel shows) equal nvidia-smi's, per
     pid and in total;
  3. a REST restart of the kernel leaves the child an orphan holding CUDA
     memory: the daemon the extension started ends it (gone from nvidia-smi
     within 8 s: reclaim's 5 s grace window first), and the state's events say so;
  4. the server stopped (SIGTERM): no gpumem process is left within 30 s.

Prints PASS/FAIL/INFO lines; exit 1 if any check failed. Every wait has a
deadline.
"""

import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostkit  # noqa: E402

P = os.environ.get("GPUMEM_WHEEL_PREFIX", "/tmp/gpumem-wheel")
OUT = os.environ.get("OUT", "/tmp/gpumem-wheel-out")
MiB = 1 << 20


def gpumem_processes():
    """pid → argv of the running `gpumem serve` processes of the wheel's
    binary (under the prefix wheel_check.sh installed into)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
            state = open("/proc/%s/stat" % d).read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (
            len(argv) > 1
            and argv[0].startswith(P.encode())
            and argv[0].endswith(b"gpumem")
            and argv[1] == b"serve"
            and state != "Z"
        ):
            out[int(d)] = b" ".join(argv).decode(errors="replace")
    return out


def main():
    binary = shutil.which("gpumem")
    hostkit.result("PASS" if binary and binary.startswith(P) else "FAIL", "gpumem on PATH is the wheel's: %s" % binary)
    before = gpumem_processes()
    hostkit.result("PASS" if not before else "FAIL", "no gpumem serve runs before the server starts (%s)" % before)

    root = os.path.join(P, "work")
    os.makedirs(os.path.join(root, "team"), exist_ok=True)
    with open(os.path.join(root, "team", "train.ipynb"), "w") as f:
        f.write('{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}')
    t_launch = time.monotonic()
    server = hostkit.Jupyter(
        os.path.join(OUT, "jupyter.log"),
        ["--ServerApp.root_dir=" + root],
        cmd=(sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", "--ip=127.0.0.1"),
        token_option="--IdentityProvider.token",
    )
    api = server.api

    try:
        hostkit.wait("jupyter server", server.up, 60)
        t_up = time.monotonic() - t_launch

        def started():
            d = (api("GET", "gpumem/api/v1/state") or {}).get("daemon") or {}
            return d if d.get("case") == "started" else None

        d = hostkit.wait("the extension to start gpumem serve", started, 30)
        hostkit.result(
            "PASS",
            "the extension started the daemon by itself %.1f s after launch (server up at %.1f s): %s"
            % (time.monotonic() - t_launch, t_up, d["text"]),
        )
        procs = gpumem_processes()
        ok = list(procs) == [d["pid"]] and ("--exit-with-parent=%d" % server.proc.pid) in procs[d["pid"]]
        hostkit.result("PASS" if ok else "FAIL", "one gpumem serve, this server's child: %s" % procs)
        checks(api, d["pid"])
    except SystemExit as e:  # a wait that timed out, or the kernel's code failed: the stop is still checked
        hostkit.result("FAIL", str(e).removeprefix("FAIL "))
    finally:
        server.stop(timeout=60)
    t_stop = time.monotonic()
    try:
        hostkit.wait("no gpumem process left after the server stopped", lambda: not gpumem_processes(), 30)
        hostkit.result("PASS", "no gpumem process %.1f s after the server exited" % (time.monotonic() - t_stop))
    except SystemExit as e:
        hostkit.result("FAIL", "%s: %s" % (e, gpumem_processes()))
    if hostkit.FAILED:
        print("FAILED: %d check(s)" % len(hostkit.FAILED))
        sys.exit(1)
    print("all checks passed")


def checks(api, daemon_pid):
    kid, kc = hostkit.start_kernel(api, "team/train.ipynb")
    try:
        kpid, cpid = hostkit.hold_with_child(kc, kid)
    finally:
        kc.stop_channels()
    hostkit.wait("nvidia-smi lists both pids", lambda: (lambda p: p if kpid in p and cpid in p else None)(hostkit.smi()), 60)

    def notebook():
        st = api("GET", "gpumem/api/v1/state")
        nbs = [n for n in st.get("notebooks") or [] if n["kernel_id"] == kid]
        if nbs and cpid in nbs[0].get("pids", []):
            return st, nbs[0]

    st, nb = hostkit.wait("the extension's state to show the notebook with its child", notebook, 30)
    print("---- GET gpumem/api/v1/state: the notebook\n" + json.dumps(nb, indent=1) + "\n----", flush=True)
    s = hostkit.smi()
    hostkit.result(
        "PASS" if nb["path"] == "team/train.ipynb" else "FAIL", "notebook path %r (want 'team/train.ipynb')" % nb["path"]
    )
    per_pid = {p["pid"]: sum(x["bytes"] for x in p["per_gpu"]) for p in nb["processes"]}
    for pid in (kpid, cpid):
        got, want = per_pid.get(pid), s.get(pid)
        ok = got is not None and want is not None and got == want * MiB
        hostkit.result("PASS" if ok else "FAIL", "extension: pid %d %s bytes = nvidia-smi %s MiB" % (pid, got, want))
    total = (s[kpid] + s[cpid]) * MiB
    hostkit.result(
        "PASS" if nb["gpu_memory_bytes"] == total else "FAIL",
        "extension: notebook total %d bytes = kernel + child per nvidia-smi (%d MiB)"
        % (nb["gpu_memory_bytes"], s[kpid] + s[cpid]),
    )
    sim = any(gpu.get("simulated") for gpu in st["gpus"])
    hostkit.result(
        "PASS" if st["gpus"] and not sim else "FAIL", "the real GPU, not simulated: %s" % [gpu["name"] for gpu in st["gpus"]]
    )

    last = st.get("last_event", 0)
    t0 = time.monotonic()
    api("POST", "api/kernels/%s/restart" % kid)
    hostkit.wait("NVML drops the orphan", lambda: cpid not in hostkit.smi(), 30)
    el = time.monotonic() - t0
    hostkit.result(
        # Reclaim watches an orphan for --reclaim-grace (5 s) before it
        # judges whether it computes; then SIGTERM and NVML's next listing.
        "PASS" if el < 8 else "FAIL",
        "after the restart, orphan %d gone from nvidia-smi in %.2f s (target < 8 s: the 5 s grace window, then the end)"
        % (cpid, el),
    )

    def reclaimed():
        evs = api("GET", "gpumem/api/v1/state?events_after=%d" % last).get("events") or []
        return [e for e in evs if e.get("kind") == "reclaim" and e.get("kernel_id") == kid]

    evs = hostkit.wait("the reclaim event in the extension's state", reclaimed, 15)
    hostkit.result("PASS", "the extension's state reports it: %s" % evs)
    d = api("GET", "gpumem/api/v1/state").get("daemon") or {}
    hostkit.result(
        "PASS" if d.get("pid") == daemon_pid else "FAIL",
        "the same daemon throughout (pid %s, was %d)" % (d.get("pid"), daemon_pid),
    )


if __name__ == "__main__":
    main()

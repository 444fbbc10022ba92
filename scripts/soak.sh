#!/usr/bin/env bash
# soak.sh: gpumem serve over a long run with real kernels, to show that its
# CPU, RSS, open fds and goroutines stay flat.
#
#   bash scripts/soak.sh [MINUTES]     (default 30)
#
# A Notebook server (Debian's notebook 6) on 127.0.0.1 with a token serves 20
# real ipykernel kernels; `gpumem serve --interval 1s` watches them with a
# simulated GPU file listing every kernel process. Every 30 s four kernels
# are restarted through the server's REST API (each kernel every 2.5 min),
# and 15 s later two others are freed with `gpumem free` (through the
# daemon). Every 10 s the daemon's CPU (utime+stime), VmRSS, open fds and
# goroutines (its /metrics) are recorded. Results:
# docs/benchmarks/soak-<date>.csv (every sample) and .txt (the summary:
# the first and last fifths of the run side by side). Everything it starts
# lives in a temp dir and its own process groups, ended at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
work=$(mktemp -d /tmp/gpumem-soak-XXXXXX)
go build -o "$work/gpumem" ./cmd/gpumem
exec /usr/bin/python3 - "$work" "$minutes" "$PWD/docs/benchmarks" <<'PY'
import json, os, secrets, signal, socket, statistics, subprocess, sys, time, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[3]), "..", "internal", "testenv"))
import simgpu  # the tests' writer of the simulated-GPU file

work, minutes, outdir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
BIN = os.path.join(work, "gpumem")
root = os.path.join(work, "notebooks")
os.makedirs(root)
env = dict(PATH="/usr/local/bin:/usr/bin:/bin", HOME=os.path.join(work, "home"),
           JUPYTER_RUNTIME_DIR=os.path.join(work, "runtime"), JUPYTER_CONFIG_DIR=os.path.join(work, "config"),
           JUPYTER_DATA_DIR=os.path.join(work, "data"), IPYTHONDIR=os.path.join(work, "ipython"),
           JUPYTER_PLATFORM_DIRS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
gpu_file = os.path.join(work, "gpus.json")
started = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, log, extra=None):
    p = subprocess.Popen(argv, env=dict(env, **(extra or {})), stdout=open(os.path.join(work, log), "w"),
                         stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
    started.append(p)
    return p


def stop_all():
    for p in reversed(started):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in started:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def wait(what, cond, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise SystemExit("soak: timed out after %ss waiting for %s" % (timeout, what))


port, token, mport = free_port(), secrets.token_hex(16), free_port()
server = start([sys.executable, "-m", "notebook", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                "--port=%d" % port, "--port-retries=0", "--NotebookApp.token=" + token,
                "--notebook-dir=" + root], "server.log")
base = "http://127.0.0.1:%d/" % port


def api(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "token " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        data = r.read()
        return json.loads(data) if data else None


def up():
    try:
        return api("GET", "api/status") is not None
    except Exception:
        return False


def kernel_pids():
    """pid of each kernel process, by kernel id (argv names its file)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
        except OSError:
            continue
        for a in argv:
            name = os.path.basename(a.decode(errors="replace"))
            if name.startswith("kernel-") and name.endswith(".json") and a.decode(errors="replace").startswith(env["JUPYTER_RUNTIME_DIR"]):
                out[name[len("kernel-"):-len(".json")]] = int(d)
    return out


def write_gpu(pids):
    procs = [simgpu.proc(p, (1 << 30) + (p << 12)) for p in sorted(pids)]
    simgpu.write(gpu_file, [simgpu.gpu(141 << 30, procs, name="Simulated H200",
                                       uuid="GPU-00000000-0000-0000-0000-00000000soak")])


def metrics():
    for attempt in range(3):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=30) as r:
                m = {}
                for line in r.read().decode().splitlines():
                    if line and not line.startswith("#") and "{" not in line:
                        k, v = line.split(" ", 1)
                        m[k] = float(v)
                return m
        except OSError as e:
            if daemon.poll() is not None:
                raise SystemExit("soak: gpumem serve exited (%s): see %s/serve.log" % (daemon.returncode, work))
            if attempt == 2:
                raise SystemExit("soak: /metrics on port %d: %s" % (mport, e))
            time.sleep(1)


def daemon_state(pid):
    stat = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    rss = 0
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return cpu, rss, len(os.listdir("/proc/%d/fd" % pid)), metrics().get("go_goroutines", 0)


try:
    write_gpu([])
    wait("the notebook server", up, 60)
    daemon = start([BIN, "serve", "--log-format=json", "--interval=1s", "--listen=127.0.0.1:%d" % mport],
                   "serve.log", {"GPUMEM_FAKE_GPU": gpu_file})
    ids = []
    for i in range(20):
        path = "soak/nb%02d.ipynb" % i
        os.makedirs(os.path.join(root, "soak"), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write('{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}')
        s = api("POST", "api/sessions", {"path": path, "name": os.path.basename(path), "type": "notebook",
                                         "kernel": {"name": "python3"}})
        ids.append(s["kernel"]["id"])
    wait("20 kernel processes", lambda: len([k for k in kernel_pids() if k in ids]) == 20, 180)
    write_gpu(kernel_pids().values())
    time.sleep(30)  # settle: kernels start, the daemon attaches and injects

    csv_path = os.path.join(outdir, "soak-%s.csv" % time.strftime("%Y-%m-%d"))
    rows = []
    t0 = time.monotonic()
    cpu0 = daemon_state(daemon.pid)[0]
    last_cpu, last_t = cpu0, t0
    restarts = frees = free_failures = restart_failures = 0
    cycle = 0
    next_restart, next_free, next_sample, next_gpu = t0, t0 + 15, t0, t0
    end = t0 + minutes * 60
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_restart:
            for k in range(4):
                kid = ids[(cycle * 4 + k) % len(ids)]
                try:
                    api("POST", "api/kernels/%s/restart" % kid)
                except Exception as e:  # the server's own trouble: counted, not the daemon's
                    restart_failures += 1
                    print("soak: restart %s: %s" % (kid, e), file=sys.stderr, flush=True)
                restarts += 1
            cycle += 1
            next_restart += 30
        if now >= next_free:
            for k in range(2):
                kid = ids[(cycle * 4 + 8 + k) % len(ids)]  # not among the ones just restarted
                r = subprocess.run([BIN, "free", kid, "--timeout=60s"], env=env, capture_output=True, text=True, timeout=120)
                frees += 1
                if r.returncode != 0:
                    free_failures += 1
                    print("soak: gpumem free %s: %s%s" % (kid, r.stdout, r.stderr), file=sys.stderr, flush=True)
            next_free += 30
        if now >= next_gpu:
            write_gpu(kernel_pids().values())
            next_gpu += 5
        if now >= next_sample:
            cpu, rss, fds, gor = daemon_state(daemon.pid)
            t = time.monotonic()
            row = {"t_s": round(t - t0, 1), "cpu_pct": round(100 * (cpu - last_cpu) / max(t - last_t, 1e-9), 2),
                   "rss_mib": round(rss / (1 << 20), 1), "fds": fds, "goroutines": int(gor)}
            last_cpu, last_t = cpu, t
            if t > t0 + 1:
                rows.append(row)
                print("soak: %s" % row, flush=True)
            next_sample += 10
        time.sleep(0.2)
    cpu1 = daemon_state(daemon.pid)[0]
    elapsed = time.monotonic() - t0
    with open(csv_path, "w") as f:
        f.write("t_s,cpu_pct,rss_mib,fds,goroutines\n")
        for r in rows:
            f.write("%(t_s)s,%(cpu_pct)s,%(rss_mib)s,%(fds)s,%(goroutines)s\n" % r)
    n = max(len(rows) // 5, 1)
    first, last = rows[:n], rows[-n:]

    def mean(rs, k):
        return statistics.mean(r[k] for r in rs)

    lines = [
        "gpumem soak: %.0f min, 20 real kernels (notebook 6, ipykernel), gpumem serve --interval 1s, simulated GPU" % (elapsed / 60),
        "machine: %s, %d cores, load average at the end %.1f; date %s; %d restarts (REST, 4 every 30 s; %d failed), "
        "%d frees (gpumem free, 2 every 30 s; %d failed)"
        % (os.uname().nodename, os.cpu_count(), os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           restarts, restart_failures, frees, free_failures),
        "daemon CPU over the whole run: %.2f %% of one core" % (100 * (cpu1 - cpu0) / elapsed),
        "%-12s %14s %14s %10s" % ("", "first fifth", "last fifth", "max"),
    ]
    for k in ("cpu_pct", "rss_mib", "fds", "goroutines"):
        lines.append("%-12s %14.1f %14.1f %10.1f" % (k, mean(first, k), mean(last, k), max(r[k] for r in rows)))
    lines.append("samples every 10 s: %s" % os.path.basename(csv_path))
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    with open(os.path.join(outdir, "soak-%s.txt" % time.strftime("%Y-%m-%d")), "w") as f:
        f.write(text)
finally:
    stop_all()
    for pid in kernel_pids().values():  # kernels are session leaders of their own
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    import shutil
    shutil.rmtree(work, ignore_errors=True)
PY

#!/usr/bin/env bash
# gpumem's run command: the newcomer's path. It installs what is missing
# (Debian packages as root, the pinned Jupyter stack in .venv/current),
# builds the jupyterlab-gpumem wheel for this machine (scripts/build-wheels.sh),
# pip-installs it into that JupyterLab environment, and starts JupyterLab 4
# on 127.0.0.1 with a token and a kernel for examples/leaks.ipynb. Nobody
# starts `gpumem serve`: the extension does, and it stops with JupyterLab.
# Without an NVIDIA driver the GPU is simulated (a file listing the real
# kernel's pid), and every figure says "simulated".
#
#   bash scripts/run.sh        start everything (state in .demo/)
#   bash scripts/run.sh stop   stop what it started
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
state=${GPUMEM_DEMO_DIR:-$repo/.demo}
port=${GPUMEM_DEMO_PORT:-8888}
metrics=${GPUMEM_DEMO_METRICS:-127.0.0.1:9464}
py=/usr/bin/python3
# The JupyterLab environment the wheel goes into (GPUMEM_LAB_PYTHON: another one).
lab_py=${GPUMEM_LAB_PYTHON:-$repo/.venv/current/bin/python}

stop() {
  for f in "$state"/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    # JupyterLab was started in a session of its own: end the group. Its
    # gpumem serve leaves after it, once its kernels' orphans are ended.
    kill -TERM -- "-$pid" 2>/dev/null && echo "stopped $(basename "$f" .pid) (pid $pid)"
    rm -f "$f"
  done
}
if [ "${1:-}" = stop ]; then
  stop
  exit 0
fi

. scripts/lib.sh
install_missing python3 python3-venv python3-ipykernel python3-torch
[ -n "${GPUMEM_LAB_PYTHON:-}" ] || make_venv current requirements/current.txt
mkdir -p "$state"

arch=$(uname -m)
with_progress "$state/build-wheels.log" "building the jupyterlab-gpumem wheel for $arch (scripts/build-wheels.sh: the extension, then the binary; a few minutes the first time)" \
  env GPUMEM_WHEEL_ARCHES="$arch" bash scripts/build-wheels.sh \
  || { tail -20 "$state/build-wheels.log"; echo "building the wheel failed: see $state/build-wheels.log"; exit 1; }
wheel=$(ls dist/jupyterlab_gpumem-*-py3-none-manylinux_*_"$arch"*.whl)
"$lab_py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
echo "installed $(basename "$wheel") into $("$lab_py" -c 'import sys; print(sys.prefix)')"
gpumem=$(dirname "$lab_py")/gpumem
stop >/dev/null 2>&1 || true

mkdir -p "$state/runtime"
chmod 700 "$state/runtime"
export JUPYTER_RUNTIME_DIR=$state/runtime
# No NVIDIA driver: a simulated GPU, so that the page shows real shapes.
# The extension's daemon inherits GPUMEM_FAKE_GPU from JupyterLab. Each
# kernel of the example notebook takes its place on it when it starts
# (scripts/demo/simulated_gpu_startup.py, an IPython startup file of the
# demo's own IPython dir): after a restart the new kernel's pid holds the
# memory, never the dead one's.
simulated=""
if ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1'; then
  simulated=$state/gpus.json
  echo '{"gpus":[{"name":"Simulated H200","uuid":"GPU-simulated-0","memory_total_bytes":150754820096,"processes":[]}]}' >"$simulated"
  mkdir -p "$state/ipython/profile_default/startup"
  cp scripts/demo/simulated_gpu_startup.py "$state/ipython/profile_default/startup/00-gpumem-demo-gpu.py"
  export IPYTHONDIR=$state/ipython GPUMEM_DEMO_GPU=$simulated GPUMEM_DEMO_BYTES=$((3 << 30)) GPUMEM_DEMO_NOTEBOOK=leaks.ipynb
fi
# The demo's settings: the daemon serves metrics; no "Jupyter news?" question.
cat >"$state/jupyter_server_config.py" <<EOF
c.Gpumem.serve_args = ["--listen=$metrics"]
EOF
mkdir -p "$state/lab-settings/@jupyterlab/apputils-extension"
echo '{"fetchNews": "false"}' >"$state/lab-settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
token=$($py -c 'import secrets; print(secrets.token_hex(24))')
echo "$token" >"$state/token"
chmod 600 "$state/token"
GPUMEM_FAKE_GPU=$simulated setsid "$lab_py" -m jupyterlab --no-browser --ip=127.0.0.1 --port="$port" --port-retries=0 --allow-root \
  --config="$state/jupyter_server_config.py" \
  --IdentityProvider.token="$token" --ServerApp.root_dir="$repo/examples" \
  --LabApp.news_url= --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
  --LabApp.user_settings_dir="$state/lab-settings" \
  >"$state/jupyter.log" 2>&1 </dev/null &
echo $! >"$state/jupyter.pid"

# Wait (deadline 90 s) for the server and the daemon its extension starts,
# then open a kernel for the example notebook and wait (30 s) until the
# daemon follows it.
kpid=$($py - "$port" "$token" "$gpumem" <<'PY'
import json, subprocess, sys, time, urllib.request
port, token, gpumem = sys.argv[1:]
base = f"http://127.0.0.1:{port}/"
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "token " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
def wait(what, check, seconds, hint):
    deadline = time.time() + seconds
    while True:
        try:
            v = check()
            if v:
                return v
        except Exception as e:
            err = e
        else:
            err = None
        if time.time() > deadline:
            sys.exit(f"{what} after {seconds} s ({err or 'not yet'}): see {hint}")
        time.sleep(0.2)
wait("JupyterLab did not answer", lambda: call("GET", "api/status"), 90, ".demo/jupyter.log")
d = wait("the extension did not start gpumem serve",
         lambda: (lambda s: s if s.get("case") in ("started", "shared") else None)(call("GET", "gpumem/api/v1/state").get("daemon") or {}),
         30, ".demo/jupyter.log and .demo/runtime/gpumem-serve.log")
print(d["text"], file=sys.stderr)
s = call("POST", "api/sessions", {"path": "leaks.ipynb", "type": "notebook", "name": "leaks.ipynb", "kernel": {"name": "python3"}})
kid = s["kernel"]["id"]
print(f"kernel {kid} started for examples/leaks.ipynb", file=sys.stderr)
def kernel_pid():
    out = subprocess.run([gpumem, "kernels", "--json"], capture_output=True, text=True, timeout=30).stdout
    return next((k["pid"] for k in json.loads(out or "[]") if k["kernel_id"] == kid and k["alive"] and k["pid"] > 0), 0)
print(wait("gpumem did not find the example kernel's process", kernel_pid, 30, ".demo/runtime/gpumem-serve.log"))
PY
)

if [ -n "$simulated" ]; then
  # The example's kernel (pid $kpid) took its 3 GiB of the simulated GPU
  # when it started.
  deadline=$((SECONDS + 30))
  until "$gpumem" ls --json 2>/dev/null | grep -q '"gpu_memory_bytes": [1-9]'; do
    if ((SECONDS > deadline)); then break; fi
    sleep 0.2
  done
fi

echo
"$gpumem" version
"$gpumem" kernels
echo
"$gpumem" ls
echo
echo "JupyterLab:        http://127.0.0.1:$port/lab/tree/leaks.ipynb?token=$token"
echo "                   (status bar: the notebook's GPU memory; right sidebar: the \"GPU memory\" panel)"
if [ -n "$simulated" ]; then
  echo "Simulated GPU:     no NVIDIA driver here; the example's kernel holds 3 GiB of it (after a restart too);"
  echo "                   edit $simulated to change the figures (pids and bytes)"
fi
echo "gpumem serve:      started by JupyterLab's extension; log $JUPYTER_RUNTIME_DIR/gpumem-serve.log, metrics http://$metrics/metrics"
echo "In this shell:     export JUPYTER_RUNTIME_DIR=$JUPYTER_RUNTIME_DIR; $gpumem ls --watch"
echo "Stop everything:   bash scripts/run.sh stop"

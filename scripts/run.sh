#!/usr/bin/env bash
# gpumem's run command. It installs what is missing (Debian packages as root,
# the pinned Jupyter stack in .venv/current, the JupyterLab extension built
# from its lock files), builds gpumem, starts JupyterLab 4 on 127.0.0.1 with
# a token and a kernel for examples/leaks.ipynb, and runs `gpumem serve`
# beside it. Without an NVIDIA driver the GPU is simulated (a file listing
# the real kernel's pid), and every figure says "simulated".
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
lab_py=$repo/.venv/current/bin/python

stop() {
  for f in "$state"/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    # Each was started in a session of its own: end the whole group (its kernels too).
    kill -TERM -- "-$pid" 2>/dev/null && echo "stopped $(basename "$f" .pid) (pid $pid)"
    rm -f "$f"
  done
}
if [ "${1:-}" = stop ]; then stop; exit 0; fi

. scripts/lib.sh
install_missing python3 python3-venv python3-ipykernel python3-torch
command -v npm >/dev/null || { echo "npm not found: install Node.js 20 with npm (it builds the JupyterLab extension)"; exit 1; }
make_venv current requirements/current.txt
mkdir -p "$state"
# The extension: rebuilt from the lock files when its sources change.
ext_stamp=$( (git ls-files -s labextension 2>/dev/null; git diff HEAD -- labextension 2>/dev/null) | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/current/.gpumem-ext-stamp 2>/dev/null)" != "$ext_stamp" ] || ! "$lab_py" -c 'import jupyterlab_gpumem' 2>/dev/null; then
  with_progress "$state/ext-build.log" "building the JupyterLab extension (labextension/, about a minute)" \
    bash labextension/scripts/build.sh "$lab_py" \
    || { echo "building the extension failed: see $state/ext-build.log"; exit 1; }
  echo "$ext_stamp" > .venv/current/.gpumem-ext-stamp
fi

mkdir -p "$state/runtime" bin
chmod 700 "$state/runtime"
# go-nvml's cgo bindings wrap every NVML function, the deprecated ones too,
# and gcc warns about each: keep the build quiet.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"
with_progress "$state/go-build.log" "building bin/gpumem (a minute or two the first time: cgo)" go build -o bin/gpumem ./cmd/gpumem \
  || { echo "building gpumem failed: see $state/go-build.log"; exit 1; }
stop >/dev/null 2>&1 || true

# No NVIDIA driver: a simulated GPU, so that the page shows real shapes.
# Each kernel of the example notebook takes its place on it when it starts
# (scripts/demo/simulated_gpu_startup.py, an IPython startup file of the
# demo's own IPython dir): after a restart the new kernel's pid holds the
# memory, never the dead one's.
simulated=""
if ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1'; then
  simulated=$state/gpus.json
  echo '{"gpus":[{"name":"Simulated H200","uuid":"GPU-simulated-0","memory_total_bytes":150754820096,"processes":[]}]}' > "$simulated"
  mkdir -p "$state/ipython/profile_default/startup"
  cp scripts/demo/simulated_gpu_startup.py "$state/ipython/profile_default/startup/00-gpumem-demo-gpu.py"
  export IPYTHONDIR=$state/ipython GPUMEM_DEMO_GPU=$simulated GPUMEM_DEMO_BYTES=$((3 << 30)) GPUMEM_DEMO_NOTEBOOK=leaks.ipynb
fi

export JUPYTER_RUNTIME_DIR=$state/runtime
# The demo's own JupyterLab settings: no "Jupyter news?" question.
mkdir -p "$state/lab-settings/@jupyterlab/apputils-extension"
echo '{"fetchNews": "false"}' > "$state/lab-settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
token=$($py -c 'import secrets; print(secrets.token_hex(24))')
echo "$token" > "$state/token"
chmod 600 "$state/token"
setsid "$lab_py" -m jupyterlab --no-browser --ip=127.0.0.1 --port="$port" --port-retries=0 --allow-root \
  --IdentityProvider.token="$token" --ServerApp.root_dir="$repo/examples" \
  --LabApp.news_url= --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
  --LabApp.user_settings_dir="$state/lab-settings" \
  >"$state/jupyter.log" 2>&1 < /dev/null &
echo $! > "$state/jupyter.pid"

# Wait (deadline 90 s) for the server, then open a kernel for the example notebook.
$py - "$port" "$token" <<'PY'
import json, sys, time, urllib.request
port, token = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}/"
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "token " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
deadline = time.time() + 90
while True:
    try:
        call("GET", "api/status"); break
    except Exception as e:
        if time.time() > deadline:
            sys.exit(f"JupyterLab did not start on {base}: {e} (see .demo/jupyter.log)")
        time.sleep(0.2)
s = call("POST", "api/sessions", {"path": "leaks.ipynb", "type": "notebook", "name": "leaks.ipynb",
                                  "kernel": {"name": "python3"}})
print(f"kernel {s['kernel']['id']} started for examples/leaks.ipynb")
PY

# The sidecar: attaches to every kernel of this runtime dir, injects %gpumem,
# reclaims orphans after restarts, serves the local API and metrics.
GPUMEM_FAKE_GPU=$simulated setsid bin/gpumem serve --listen="$metrics" --log-format=console \
  >"$state/gpumem.log" 2>&1 < /dev/null &
echo $! > "$state/gpumem.pid"
deadline=$((SECONDS + 30))
until [ -S "$JUPYTER_RUNTIME_DIR/gpumem.sock" ] && bin/gpumem kernels --json 2>/dev/null | grep -q '"alive": true'; do
  if ((SECONDS > deadline)); then echo "gpumem serve did not start: see $state/gpumem.log"; exit 1; fi
  sleep 0.2
done
if [ -n "$simulated" ]; then
  # The example's kernel took its 3 GiB of the simulated GPU when it started.
  deadline=$((SECONDS + 30))
  until bin/gpumem ls --json 2>/dev/null | grep -q '"gpu_memory_bytes": [1-9]'; do
    if ((SECONDS > deadline)); then break; fi
    sleep 0.2
  done
fi

echo
bin/gpumem kernels
echo
bin/gpumem ls
echo
echo "JupyterLab:        http://127.0.0.1:$port/lab/tree/leaks.ipynb?token=$token"
echo "                   (status bar: the notebook's GPU memory; right sidebar: the \"GPU memory\" panel)"
if [ -n "$simulated" ]; then
  echo "Simulated GPU:     no NVIDIA driver here; the example's kernel holds 3 GiB of it (after a restart too);"
  echo "                   edit $simulated to change the figures (pids and bytes)"
fi
echo "gpumem serve log:  $state/gpumem.log     metrics: http://$metrics/metrics"
echo "In this shell:     export JUPYTER_RUNTIME_DIR=$JUPYTER_RUNTIME_DIR; bin/gpumem ls --watch"
echo "Stop everything:   bash scripts/run.sh stop"

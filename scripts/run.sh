#!/usr/bin/env bash
# gpumem's run command. On a machine where no Jupyter runs, it installs Jupyter
# if missing (Debian packages, as root), builds gpumem, starts a Notebook
# server on 127.0.0.1 with a token and a kernel for examples/leaks.ipynb, and
# runs `gpumem serve` beside it.
#
#   bash scripts/run.sh        start everything (state in .demo/)
#   bash scripts/run.sh stop   stop what it started
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
state=${GPUMEM_DEMO_DIR:-$repo/.demo}
port=${GPUMEM_DEMO_PORT:-8888}
py=/usr/bin/python3

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
install_missing python3-ipykernel python3-jupyter-client jupyter-notebook

mkdir -p "$state/runtime" bin
# go-nvml's cgo bindings wrap every NVML function, the deprecated ones too,
# and gcc warns about each: keep the build quiet.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"
go build -o bin/gpumem ./cmd/gpumem
stop >/dev/null 2>&1 || true

export JUPYTER_RUNTIME_DIR=$state/runtime
token=$($py -c 'import secrets; print(secrets.token_hex(24))')
echo "$token" > "$state/token"
chmod 600 "$state/token"
setsid $py -m notebook --no-browser --ip=127.0.0.1 --port="$port" --port-retries=0 --allow-root \
  --NotebookApp.token="$token" --NotebookApp.notebook_dir="$repo/examples" \
  >"$state/jupyter.log" 2>&1 < /dev/null &
echo $! > "$state/jupyter.pid"

# Wait (deadline 60 s) for the server, then open a kernel for the example notebook.
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
deadline = time.time() + 60
while True:
    try:
        call("GET", "api/status"); break
    except Exception as e:
        if time.time() > deadline:
            sys.exit(f"Jupyter did not start on {base}: {e} (see .demo/jupyter.log)")
        time.sleep(0.2)
s = call("POST", "api/sessions", {"path": "leaks.ipynb", "type": "notebook", "name": "leaks.ipynb",
                                  "kernel": {"name": "python3"}})
print(f"kernel {s['kernel']['id']} started for examples/leaks.ipynb")
PY

# The sidecar: attaches to every kernel of this runtime dir, injects %gpumem,
# reclaims orphans after restarts, serves the local API and metrics.
setsid bin/gpumem serve --listen=127.0.0.1:9464 --log-format=console \
  >"$state/gpumem.log" 2>&1 < /dev/null &
echo $! > "$state/gpumem.pid"
deadline=$((SECONDS + 30))
until [ -S "$JUPYTER_RUNTIME_DIR/gpumem.sock" ] && bin/gpumem kernels --json 2>/dev/null | grep -q '"alive": true'; do
  if ((SECONDS > deadline)); then echo "gpumem serve did not start: see $state/gpumem.log"; exit 1; fi
  sleep 0.2
done

echo
bin/gpumem kernels
echo
bin/gpumem ls
echo
echo "Jupyter Notebook:  http://127.0.0.1:$port/notebooks/leaks.ipynb?token=$token"
echo "gpumem serve log:  $state/gpumem.log     metrics: http://127.0.0.1:9464/metrics"
echo "In this shell:     export JUPYTER_RUNTIME_DIR=$JUPYTER_RUNTIME_DIR; bin/gpumem ls --watch"
echo "Stop everything:   bash scripts/run.sh stop"

#!/usr/bin/env bash
# gpumem's run command: the newcomer's path. It installs what is missing
# (Debian packages as root, the pinned Jupyter stack in .venv/current),
# builds the jupyterlab-gpumem wheel for this machine (scripts/build-wheels.sh),
# pip-installs it into that JupyterLab environment, and runs `gpumem demo`
# from it: JupyterLab 4 on 127.0.0.1 with a token and a kernel for
# examples/leaks.ipynb. Nobody starts `gpumem serve`: the extension does, and
# it stops with JupyterLab. Without an NVIDIA driver the GPU is simulated (a
# file listing the real kernel's pid), and every figure says "simulated".
#
#   bash scripts/run.sh        start everything (state in .demo/)
#   bash scripts/run.sh stop   stop what it started
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
state=${GPUMEM_DEMO_DIR:-$repo/.demo}
port=${GPUMEM_DEMO_PORT:-8888}
metrics=${GPUMEM_DEMO_METRICS:-127.0.0.1:9464}
# The JupyterLab environment the wheel goes into (GPUMEM_LAB_PYTHON: another one).
lab_py=${GPUMEM_LAB_PYTHON:-$repo/.venv/current/bin/python}

stop() {
  for f in "$state"/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    # gpumem demo was started in a session of its own: end the group.
    if kill -TERM -- "-$pid" 2>/dev/null; then
      # gpumem demo stops JupyterLab, which ends its kernels and daemon:
      # wait for it (it gives JupyterLab 30 s, then kills it).
      for _ in $(seq 400); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      echo "stopped $(basename "$f" .pid) (pid $pid)"
    fi
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

# gpumem demo starts JupyterLab on 127.0.0.1 with a token in $state (its
# runtime dir, the example notebook, settings and logs), opens a kernel for
# the example and waits until the daemon JupyterLab's extension starts
# follows it; without an NVIDIA driver the GPU is simulated. It prints where
# everything is, then runs until it is stopped (SIGTERM stops JupyterLab,
# its kernels and its daemon).
setsid "$gpumem" demo --dir "$state" --port "$port" --metrics "$metrics" >"$state/demo.log" 2>&1 </dev/null &
echo $! >"$state/demo.pid"
deadline=$((SECONDS + 240))
until grep -q '^Stop:' "$state/demo.log"; do
  if ! kill -0 "$(cat "$state/demo.pid")" 2>/dev/null; then
    cat "$state/demo.log"
    rm -f "$state/demo.pid"
    echo "gpumem demo exited before JupyterLab was ready: its logs are in $state"
    exit 1
  fi
  if ((SECONDS > deadline)); then
    cat "$state/demo.log"
    stop
    echo "gpumem demo was not ready within 240 s: its logs are in $state"
    exit 1
  fi
  sleep 0.2
done
grep -v '^Stop:' "$state/demo.log"
echo "Stop everything:   bash scripts/run.sh stop"

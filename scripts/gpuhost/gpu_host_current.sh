#!/usr/bin/env bash
# gpu_host_current.sh: the GPU-host checks on today's Jupyter stack
# (jupyter_server 2.21, the server JupyterLab 4 and Notebook 7 run on;
# jupyter_client 8.10; ipykernel 7.4; IPython 9.18; pyzmq 27.3).
#
# Runs ON the lent GPU host (Python 3.12 with torch/CUDA at
# /opt/torch/.venv/bin/python3, no network), from the copied checkout's root.
# Needs, carried with the checkout:
#   .whl/          cp312 manylinux wheels of requirements/gpu-host-current.txt
#                  (that stack and every dependency, one version each),
#                  fetched on a machine with network, in the checkout's root:
#     echo /.whl/ >> .git/info/exclude
#     grep -o '^[a-z0-9._-]*==[^ ]*' requirements/gpu-host-current.txt | xargs -n1 \
#       python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
#       --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl
#   .gpukit/gpumem a cgo build of gpumem (go build -o .gpukit/gpumem ./cmd/gpumem)
#
# It installs the wheels into a private prefix (never into the system
# python), starts nothing outside it, and runs:
#   1. scripts/gpuhost/gpu_host_check.py against a jupyter_server 2 + ipykernel 7
#      kernel (attribution vs nvidia-smi, timing, gpumem free through the
#      daemon, orphan reclaimed after a restart);
#   2. scripts/gpuhost/gpu_check.py in kernel mode (ipykernel 7 / IPython 9): the
#      magics' free path on PyTorch, CuPy and JAX;
#   3. scripts/gpuhost/gpu_host_pods.py: `gpumem serve --pod-kernels` against a
#      kernel in a played pod (root: namespaces and cgroups);
#   4. scripts/gpuhost/arbiter_check.py: the hub's arbiter against the root
#      daemon while a training loop computes, and once it stops (root);
#   5. scripts/gpuhost/ls_timing.py with a server, 4 kernels and 5,000
#      sleepers (GPUMEM_BASE_BIN: another build in the same alternation).
# GPUMEM_CURRENT_STEPS picks some of them (default "check magics pods";
# "arbiter" and "ls" on demand).
# Outputs land in $OUT (default /tmp/gpumem-current-out): gpu_host_check.txt,
# gpu_check_kernel.txt, versions.txt, and the server's and daemon's logs.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${GPUKIT_PYTHON:-/opt/torch/.venv/bin/python3}
P=${GPUMEM_CURRENT_PREFIX:-/tmp/gpumem-current}
OUT=${OUT:-/tmp/gpumem-current-out}
BIN=${GPUMEM_BIN:-$PWD/.gpukit/gpumem}
[ -x "$PY" ] || { echo "no python at $PY (set GPUKIT_PYTHON)"; exit 1; }
[ -x "$BIN" ] || { echo "no gpumem binary at $BIN: build it with go build -o .gpukit/gpumem ./cmd/gpumem"; exit 1; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl/: carry the folder with the checkout"; exit 1; }
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: this is not the GPU host"; exit 1; }

rm -rf "$P"
mkdir -p "$P"/{site,bin,runtime,config,data,ipython,work,share/jupyter/kernels/python3} "$OUT"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$P/site" .whl/*.whl

# The wheels shadow whatever the torch venv has of the same packages; torch,
# CuPy and JAX stay the venv's.
export PYTHONPATH=$P/site
export JUPYTER_RUNTIME_DIR=$P/runtime JUPYTER_CONFIG_DIR=$P/config JUPYTER_DATA_DIR=$P/data
export IPYTHONDIR=$P/ipython JUPYTER_PATH=$P/share/jupyter JUPYTER_PLATFORM_DIRS=1
export GPUKIT=$P GPUKIT_PYTHON=$PY GPUMEM_BIN=$BIN OUT
export PATH=$P/bin:$PATH
# `jupyter server` as the check starts it: jupyter_core's launcher finds
# jupyter-server on PATH.
printf '#!/bin/sh\nexec %s -m jupyter "$@"\n' "$PY" >"$P/bin/jupyter"
printf '#!/bin/sh\nexec %s -m jupyter_server "$@"\n' "$PY" >"$P/bin/jupyter-server"
chmod +x "$P/bin/jupyter" "$P/bin/jupyter-server"
cat >"$P/share/jupyter/kernels/python3/kernel.json" <<EOF
{"argv": ["$PY", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
 "display_name": "Python 3 (ipykernel 7)", "language": "python"}
EOF
cat >"$P/config/jupyter_server_config.json" <<EOF
{"ServerApp": {"ip": "127.0.0.1", "open_browser": false, "allow_root": true, "root_dir": "$P/work"}}
EOF

"$PY" - <<'EOF' | tee "$OUT/versions.txt"
import sys, importlib.metadata as md
names = ["jupyter_server", "jupyter_client", "ipykernel", "ipython", "pyzmq", "tornado", "traitlets", "torch"]
print("python", sys.version.split()[0])
for n in names:
    try:
        print(n, md.version(n))
    except md.PackageNotFoundError:
        print(n, "missing")
import ipykernel, jupyter_server, IPython, zmq
for m in (jupyter_server, ipykernel, IPython, zmq):
    print(m.__name__, "from", m.__file__.rsplit("/" + m.__name__ + "/", 1)[0])
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/versions.txt"

rc=0
steps=" ${GPUMEM_CURRENT_STEPS:-check magics pods} "
if [[ $steps == *" check "* ]]; then
  echo "== scripts/gpuhost/gpu_host_check.py (jupyter_server 2 + ipykernel 7)"
  "$PY" scripts/gpuhost/gpu_host_check.py 2>&1 | tee "$OUT/gpu_host_check.txt" || rc=1
fi
if [[ $steps == *" magics "* ]]; then
  echo "== scripts/gpuhost/gpu_check.py --mode kernel (ipykernel 7, IPython 9)"
  "$PY" scripts/gpuhost/gpu_check.py --mode kernel 2>&1 | tee "$OUT/gpu_check_kernel.txt" || rc=1
fi
if [[ $steps == *" pods "* ]]; then
  echo "== scripts/gpuhost/gpu_host_pods.py (gpumem serve --pod-kernels, a pod played with namespaces and cgroups)"
  "$PY" scripts/gpuhost/gpu_host_pods.py 2>&1 | tee "$OUT/gpu_host_pods.txt" || rc=1
fi
if [[ $steps == *" arbiter "* ]]; then
  echo "== scripts/gpuhost/arbiter_check.py (jupyterlab_gpumem.hub.GPUArbiter, the root daemon, a training loop)"
  "$PY" scripts/gpuhost/arbiter_check.py 2>&1 | tee "$OUT/arbiter_check.txt" || rc=1
fi
if [[ $steps == *" ls "* ]]; then
  echo "== scripts/gpuhost/ls_timing.py (a server, 4 kernels, 5,000 sleepers)"
  "$PY" scripts/gpuhost/ls_timing.py --gpumem "$BIN" ${GPUMEM_BASE_BIN:+--base "$GPUMEM_BASE_BIN"} \
    --python "$PY" --kernels 4 --sleepers 5000 2>&1 | tee "$OUT/ls_timing.txt" || rc=1
fi
cp "$P"/runtime/*.log "$OUT"/ 2>/dev/null || true
exit $rc

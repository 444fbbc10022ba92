#!/usr/bin/env bash
# wheel_check.sh: the jupyterlab-gpumem wheel on the GPU host, as a user
# installs it: pip install into the host's Python 3.12 (torch/CUDA) next to
# jupyter_server 2, a server started with no gpumem daemon, then
# scripts/gpuhost/wheel_check.py: the daemon starts by itself; the
# extension's per-notebook figures equal nvidia-smi's; a kernel restart
# still reclaims an orphan; the server's stop leaves no gpumem process.
#
# Runs ON the lent GPU host (no network, no Go), from the copied checkout's
# root, with only carried files:
#   dist/   the x86_64 wheel from `bash scripts/build-wheels.sh` (built here)
#   .whl/   cp312 manylinux wheels of requirements/gpu-host-wheel.txt,
#           fetched on a machine with network, in the checkout's root:
#     grep -o '^[a-z0-9._-]*==[^ ]*' requirements/gpu-host-wheel.txt | xargs -n1 \
#       python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl
#
# pip installs everything with the host's Python under a prefix of its own
# (--prefix: bin/gpumem, the package, share/jupyter and etc/jupyter as in a
# virtualenv), never into the system's or the torch venv's site-packages;
# PYTHONPATH, PATH, JUPYTER_PATH and JUPYTER_CONFIG_PATH point there.
# Output: $OUT (default /tmp/gpumem-wheel-out): wheel_check.txt, versions.txt,
# the server's log and the daemon's (gpumem-serve.log).
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${GPUKIT_PYTHON:-/opt/torch/.venv/bin/python3}
P=${GPUMEM_WHEEL_PREFIX:-/tmp/gpumem-wheel}
OUT=${OUT:-/tmp/gpumem-wheel-out}
[ -x "$PY" ] || { echo "no python at $PY (set GPUKIT_PYTHON)"; exit 1; }
wheel=$(ls dist/jupyterlab_gpumem-*-py3-none-manylinux_*_x86_64*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "no x86_64 wheel in dist/: build it with bash scripts/build-wheels.sh and carry dist"; exit 1; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl/: fetch requirements/gpu-host-wheel.txt's (see this script's header) and carry the folder"; exit 1; }
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: this is not the GPU host"; exit 1; }

rm -rf "$P"
mkdir -p "$P"/{runtime,config,data,ipython,work} "$OUT"
t0=$(date +%s%N)
"$PY" -m pip install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check --prefix "$P" \
  -r <(grep -o '^[a-z0-9._-]*==[^ ]*' requirements/gpu-host-wheel.txt) --find-links .whl
"$PY" -m pip install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check --prefix "$P" "$wheel"
echo "pip installed the stack and $(basename "$wheel") in $((($(date +%s%N) - t0) / 1000000)) ms"
site=$("$PY" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib", vars={"base": sys.argv[1], "platbase": sys.argv[1]}))' "$P")

# The stack shadows whatever the torch venv has of the same packages; torch,
# CuPy and JAX stay the venv's.
export PYTHONPATH=$site
export PATH=$P/bin:$PATH
export JUPYTER_PATH=$P/share/jupyter JUPYTER_CONFIG_PATH=$P/etc/jupyter
export JUPYTER_RUNTIME_DIR=$P/runtime JUPYTER_CONFIG_DIR=$P/config JUPYTER_DATA_DIR=$P/data
export IPYTHONDIR=$P/ipython JUPYTER_PLATFORM_DIRS=1
export GPUMEM_WHEEL_PREFIX=$P GPUKIT_PYTHON=$PY OUT
unset GPUMEM_SOCKET GPUMEM_FAKE_GPU
# The kernelspec: this Python (ipykernel from the prefix, torch from the venv).
mkdir -p "$P/share/jupyter/kernels/python3"
cat >"$P/share/jupyter/kernels/python3/kernel.json" <<EOF2
{"argv": ["$PY", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
 "display_name": "Python 3 (ipykernel 7)", "language": "python"}
EOF2

{
  "$PY" -c 'import sys; print("python", sys.version.split()[0])'
  for m in jupyter_server jupyter_client ipykernel torch jupyterlab_gpumem; do
    "$PY" -c "import importlib.metadata as md, sys; n = sys.argv[1]; print(n, md.version(n.replace('_', '-')))" "$m" 2>/dev/null || echo "$m missing"
  done
  command -v gpumem
  gpumem version
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} | tee "$OUT/versions.txt"

rc=0
"$PY" scripts/gpuhost/wheel_check.py 2>&1 | tee "$OUT/wheel_check.txt" || rc=1
cp "$P"/runtime/*.log "$OUT"/ 2>/dev/null || true
exit $rc

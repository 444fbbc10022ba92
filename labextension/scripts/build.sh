#!/usr/bin/env bash
# Builds jupyterlab_gpumem from the lock files and installs it into the
# Python environment that runs JupyterLab (default: the repository's
# .venv/current): npm ci, TypeScript, the prebuilt labextension, the wheel.
#
#   bash labextension/scripts/build.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-${GPUMEM_LAB_PYTHON:-$PWD/../.venv/current/bin/python}}
[ -x "$py" ] || { echo "no Python at $py: build the venv first (scripts/lib.sh make_venv current requirements/current.txt)" >&2; exit 1; }
bindir=$(dirname "$py")
export PATH=$bindir:$PATH   # jupyter-builder comes from that environment

npm ci --no-audit --no-fund --loglevel=error
rm -rf lib tsconfig.tsbuildinfo jupyterlab_gpumem/labextension dist
npm run build
"$py" -m pip wheel . --no-deps --no-build-isolation -w dist -q
"$py" -m pip install -q --no-deps --force-reinstall dist/jupyterlab_gpumem-*.whl
"$py" -m jupyter labextension list 2>&1 | grep -q 'jupyterlab-gpumem.*enabled.*OK' \
  || { echo "JupyterLab does not list jupyterlab-gpumem as enabled after the install" >&2; exit 1; }
echo "jupyterlab_gpumem installed into $("$py" -c 'import sys; print(sys.prefix)')"

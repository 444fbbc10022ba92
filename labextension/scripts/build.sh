#!/usr/bin/env bash
# Builds jupyterlab_gpumem from the lock files.
#
#   bash labextension/scripts/build.sh [PYTHON]   the prebuilt labextension, then a
#       pure wheel (no gpumem binary: the extension's own tests build the daemon
#       with go) installed into PYTHON's environment (default .venv/current)
#   bash labextension/scripts/build.sh --js BINDIR   only the prebuilt labextension
#       (jupyterlab_gpumem/labextension), with jupyter-builder from BINDIR;
#       skipped when it was built from the same sources. scripts/build-wheels.sh
#       uses this for the wheels users install.
set -euo pipefail
cd "$(dirname "$0")/.."
ext=jupyterlab_gpumem/labextension
# Everything the prebuilt extension is built from, committed or not.
sources_stamp() {
  (git ls-files -s -- src style package.json package-lock.json tsconfig.json
   git diff HEAD -- src style package.json package-lock.json tsconfig.json
   git ls-files --others --exclude-standard -- src style | xargs -r sha256sum) | sha256sum | cut -d' ' -f1
}
build_js() {
  export PATH=$1:$PATH # jupyter-builder comes from that environment
  npm ci --no-audit --no-fund --loglevel=error
  rm -rf lib tsconfig.tsbuildinfo "$ext" dist
  npm run build
  sources_stamp >.labextension-sha256
}

if [ "${1:-}" = --js ]; then
  bindir=${2:?--js needs the bin dir of a Python environment with jupyter-builder}
  if [ -f "$ext/static/style.js" ] && [ "$(cat .labextension-sha256 2>/dev/null)" = "$(sources_stamp)" ]; then
    echo "the prebuilt labextension is up to date ($ext)"
    exit 0
  fi
  build_js "$bindir"
  exit 0
fi

py=${1:-${GPUMEM_LAB_PYTHON:-$PWD/../.venv/current/bin/python}}
[ -x "$py" ] || { echo "no Python at $py: build the venv first (scripts/lib.sh make_venv current requirements/current.txt)" >&2; exit 1; }
build_js "$(dirname "$py")"
env -u GPUMEM_WHEEL_BINARY "$py" -m pip wheel . --no-deps --no-build-isolation -w dist -q
"$py" -m pip install -q --no-deps --force-reinstall dist/jupyterlab_gpumem-*-py3-none-any.whl
"$py" -m jupyter labextension list 2>&1 | grep -q 'jupyterlab-gpumem.*enabled.*OK' \
  || { echo "JupyterLab does not list jupyterlab-gpumem as enabled after the install" >&2; exit 1; }
echo "jupyterlab_gpumem installed into $("$py" -c 'import sys; print(sys.prefix)')"

#!/usr/bin/env bash
# The JupyterLab extension's and the wheels' builds and tests, one after
# the other, as they share labextension/ and build/ (scripts/test.sh runs
# this as one lane beside its stages; it needs what test.sh installs:
# Debian's packages, chromium, go, npm):
#   1. the extension, built from its lock files into .venv/lab, a
#      virtualenv of today's stack of its own (the end-to-end tests run
#      .venv/current's servers meanwhile, which must not load it); its
#      prebuilt JavaScript then serves the wheels too (their build finds
#      it up to date instead of building it again);
#   2. the wheels users install (tests/wheel/test.sh --prepare: the
#      bullseye chroot, both wheels, the reproducibility build);
#   3. the extension's lint, front-end unit tests, server extension's tests
#      and browser tests (labextension/scripts/test.sh, without its build);
#   4. the wheels' tests (tests/wheel/test.sh --tests).
# A step whose build failed is not tested; every other step runs. Each
# step's time is listed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
times=()
# step NAME CMD...: runs CMD, records its time, and NAME when it fails.
step() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "== $name"
  "$@" || rc=$?
  times+=("$(printf '%-24s %5d s' "$name" $((SECONDS - start)))")
  ((rc == 0)) || failed+=("$name")
  return "$rc"
}
. scripts/lib.sh
export GPUMEM_LAB_PYTHON=$PWD/.venv/lab/bin/python
ext_built=true wheels_built=true
step "the extension's virtualenv" make_venv lab requirements/current.txt &&
  step "the extension's build" bash labextension/scripts/build.sh || ext_built=false
step "the wheels' build" bash tests/wheel/test.sh --prepare || wheels_built=false
if $ext_built; then
  step "the extension's tests" env GPUMEM_EXT_SKIP_BUILD=1 bash labextension/scripts/test.sh
fi
if $wheels_built; then
  step "the wheels' tests" bash tests/wheel/test.sh --tests
fi
printf '  %s\n' "${times[@]}"
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi

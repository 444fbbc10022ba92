#!/usr/bin/env bash
# The wheel's tests (scripts/test.sh runs this): builds both wheels
# (scripts/build-wheels.sh), checks that a second build of the x86_64
# binary from another dir with empty caches is the same bytes, and runs
# tests/wheel against them: a fresh virtualenv with JupyterLab and the
# wheel, real servers and kernels, Debian's chromium; the x86_64 binary in a
# Debian 11 (bullseye, glibc 2.31) chroot and the aarch64 one under
# qemu-aarch64. Installs what they need when missing: debootstrap,
# qemu-user, libc6-arm64-cross, binutils (readelf), chromium. The chroot is
# made once and cached under ~/.cache/gpumem, keyed by its suite; it is
# made while the wheels build.
#
#   bash tests/wheel/test.sh             build, then test
#   bash tests/wheel/test.sh --prepare   build only: the chroot, both wheels, the
#                                        reproducibility build (scripts/test.sh
#                                        runs this while the Go tests run)
#   bash tests/wheel/test.sh --tests     test what --prepare built
set -euo pipefail
cd "$(dirname "$0")/../.."
phase=all
case ${1:-} in
  --prepare) phase=prepare; shift ;;
  --tests) phase=tests; shift ;;
esac
. scripts/lib.sh
install_missing debootstrap qemu-user libc6-arm64-cross binutils chromium
cache=${GPUMEM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumem}
suite=bullseye
chroot=$cache/chroot-$suite
logs=$(mktemp -d /tmp/gpumem-wheel-logs.XXXXXX)
start=$(date +%s)

if [ "$phase" != tests ]; then
  chroot_job=""
  if [ ! -f "$chroot/.complete" ]; then
    # Debian's mirror as this machine's apt knows it.
    mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$mirror" ] || { echo "no Debian mirror in /etc/apt/sources.list*: cannot make the $suite chroot" >&2; exit 1; }
    echo "making the $suite chroot in $chroot (once; log $logs/debootstrap.log)"
    (rm -rf "$chroot" && mkdir -p "$cache" &&
      debootstrap --variant=minbase "$suite" "$chroot" "$mirror" &&
      touch "$chroot/.complete") >"$logs/debootstrap.log" 2>&1 &
    chroot_job=$!
  fi

  bash scripts/build-wheels.sh
  echo "wheels built $(($(date +%s) - start)) s into the wheel tests"
  # A second build of the x86_64 binary from another dir, empty caches:
  # the same bytes (it needs the first build's binary, nothing else). It
  # runs while the chroot is made (and, without --prepare, the tests run).
  bash scripts/build-wheels.sh --reproduce >"$logs/reproduce.log" 2>&1 &
  reproduce_job=$!

  if [ -n "$chroot_job" ]; then
    wait "$chroot_job" || { tail -20 "$logs/debootstrap.log"; echo "debootstrap of $suite failed: see $logs/debootstrap.log" >&2; exit 1; }
    echo "the $suite chroot was made $(($(date +%s) - start)) s into the wheel tests"
  fi
  if [ "$phase" = prepare ]; then
    wait "$reproduce_job" || { cat "$logs/reproduce.log"; echo "the reproducibility build failed: see above" >&2; exit 1; }
    cat "$logs/reproduce.log"
    echo "wheels prepared in $(($(date +%s) - start)) s"
    exit 0
  fi
fi

[ -f "$chroot/.complete" ] || { echo "no $suite chroot at $chroot: run bash tests/wheel/test.sh --prepare first" >&2; exit 1; }
ls dist/jupyterlab_gpumem-*_x86_64.whl dist/jupyterlab_gpumem-*_aarch64.whl >/dev/null ||
  { echo "no wheels in dist/: run bash tests/wheel/test.sh --prepare first" >&2; exit 1; }
tools=$(tools_venv "$cache" requirements/build-tools.txt)
rc=0
GPUMEM_CHROOT_BULLSEYE=$chroot GPUMEM_BUILD_TOOLS=$tools GPUMEM_ARTIFACTS=${GPUMEM_ARTIFACTS:-$logs} \
  .venv/current/bin/python -m pytest -q -p no:cacheprovider tests/wheel "$@" || rc=1
if [ -n "${reproduce_job:-}" ]; then
  wait "$reproduce_job" || rc=1
  cat "$logs/reproduce.log"
fi
echo "wheel tests: $(($(date +%s) - start)) s"
exit $rc

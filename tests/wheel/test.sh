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
# made while the wheels build, and the reproducibility build runs while the
# tests run.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
install_missing debootstrap qemu-user libc6-arm64-cross binutils chromium
cache=${GPUMEM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumem}
suite=bullseye
chroot=$cache/chroot-$suite
logs=$(mktemp -d /tmp/gpumem-wheel-logs.XXXXXX)
start=$(date +%s)

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
tools=$(tools_venv "$cache" requirements/build-tools.txt)

bash scripts/build-wheels.sh --reproduce >"$logs/reproduce.log" 2>&1 &
reproduce_job=$!

if [ -n "$chroot_job" ]; then
  wait "$chroot_job" || { tail -20 "$logs/debootstrap.log"; echo "debootstrap of $suite failed: see $logs/debootstrap.log" >&2; exit 1; }
  echo "the $suite chroot was made $(($(date +%s) - start)) s into the wheel tests"
fi

rc=0
GPUMEM_CHROOT_BULLSEYE=$chroot GPUMEM_BUILD_TOOLS=$tools GPUMEM_ARTIFACTS=${GPUMEM_ARTIFACTS:-$logs} \
  .venv/current/bin/python -m pytest -q -p no:cacheprovider tests/wheel "$@" || rc=1
if wait "$reproduce_job"; then
  cat "$logs/reproduce.log"
else
  cat "$logs/reproduce.log"
  rc=1
fi
echo "wheel tests: $(($(date +%s) - start)) s"
exit $rc

#!/usr/bin/env bash
# Builds the jupyterlab-gpumem wheels into dist/, one per architecture:
#   jupyterlab_gpumem-<version>-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
#   jupyterlab_gpumem-<version>-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl
# Each holds the gpumem binary for its architecture (installed on PATH), the
# prebuilt JupyterLab extension and the server extension. libnvidia-ml is
# never in it: the binary dlopens the host driver's at run time.
#
# The binary is built with `zig cc -target <arch>-linux-gnu.2.17` as cgo's
# compiler (scripts/zigcc), so that it starts on glibc 2.17 and newer
# whatever this machine's glibc, and cross-built for aarch64 the same way;
# -trimpath, -buildvcs=false and the commit given by -X make two builds of
# one commit the same bytes. `auditwheel show` checks each wheel against the
# manylinux policies (it must say manylinux_2_17 or older) and names the glibc symbol
# versions the binary needs.
#
# The tools (zig, auditwheel, jupyter-builder, hatch) come from the hashed
# lock requirements/build-tools.txt, in a virtualenv cached under
# ~/.cache/gpumem keyed by the lock's hash; zig's and Go's own caches keep
# rebuilds fast.
#
#   bash scripts/build-wheels.sh                 both wheels
#   GPUMEM_WHEEL_ARCHES=x86_64 bash scripts/...   one
#   bash scripts/build-wheels.sh --reproduce      builds the x86_64 binary again
#       from a copy of this tree in another dir, with empty Go and zig caches,
#       and fails unless it is the same bytes as build/wheel/x86_64/gpumem
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
. scripts/lib.sh
install_missing python3-venv
command -v npm >/dev/null || { echo "npm not found: install Node.js 20 with npm (it builds the JupyterLab extension)" >&2; exit 1; }
command -v go >/dev/null || { echo "go not found: install Go 1.26 or newer" >&2; exit 1; }

cache=${GPUMEM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumem}
tools=$(tools_venv "$cache" requirements/build-tools.txt)
export ZIG
ZIG=$("$tools/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')

version=$(node -p 'require("./labextension/package.json").version')
commit=$(git rev-parse --short=12 HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit=$commit-dirty
# Reproducible archives: every timestamp is the commit's.
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)

# build_binary ARCH OUT: gpumem for ARCH (x86_64, aarch64) into OUT, from
# the tree in the current directory.
build_binary() {
  local arch=$1 out=$2 goarch
  case $arch in
    x86_64) goarch=amd64 ;;
    aarch64) goarch=arm64 ;;
    *) echo "unknown architecture $arch: x86_64 or aarch64" >&2; return 1 ;;
  esac
  # No -g: the wheel carries no C debug info (Go's is stripped by -s -w).
  CGO_ENABLED=1 GOOS=linux GOARCH=$goarch CC="$repo/scripts/zigcc $arch-linux-gnu.2.17" \
    CGO_CFLAGS="-O2 -Wno-deprecated-declarations" \
    go build -trimpath -buildvcs=false -ldflags="-s -w -X github.com/gpumem/gpumem.commit=$commit" \
    -o "$out" ./cmd/gpumem
}

build=build/wheel
if [ "${1:-}" = --reproduce ]; then
  first=$build/x86_64/gpumem
  [ -f "$first" ] || { echo "no $first: run bash scripts/build-wheels.sh first" >&2; exit 1; }
  tmp=$(mktemp -d /tmp/gpumem-reproduce.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/src"
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
  start=$(date +%s)
  (cd "$tmp/src" && GOCACHE=$tmp/gocache ZIG_GLOBAL_CACHE_DIR=$tmp/zigcache build_binary x86_64 "$tmp/gpumem")
  a=$(sha256sum <"$first" | cut -d' ' -f1)
  b=$(sha256sum <"$tmp/gpumem" | cut -d' ' -f1)
  if [ "$a" != "$b" ]; then
    echo "NOT reproducible: $first is $a, the same commit built again in $tmp/src is $b" >&2
    exit 1
  fi
  echo "reproducible: sha256 $a, built again in another dir with empty Go and zig caches in $(($(date +%s) - start)) s"
  exit 0
fi

echo "== the prebuilt JupyterLab extension"
bash labextension/scripts/build.sh --js "$tools/bin"

mkdir -p dist "$build"
for arch in ${GPUMEM_WHEEL_ARCHES:-x86_64 aarch64}; do
  echo "== gpumem $version ($commit) for $arch"
  rm -f dist/jupyterlab_gpumem-*_"$arch".whl
  bin=$build/$arch/gpumem
  mkdir -p "$(dirname "$bin")"
  start=$(date +%s)
  build_binary "$arch" "$bin"
  echo "built $bin in $(($(date +%s) - start)) s: $(du -h "$bin" | cut -f1)"
  # Tagged for glibc 2.17, the glibc zig linked it against; auditwheel
  # then checks that the binary meets that policy (every symbol version
  # it needs, every library it links) and lists the versions.
  plat=manylinux_2_17_$arch.manylinux2014_$arch
  (cd labextension && GPUMEM_WHEEL_BINARY="$repo/$bin" GPUMEM_WHEEL_PLATFORM="$plat" \
    "$tools/bin/python" -m pip wheel . --no-deps --no-build-isolation -q -w "$repo/dist")
  whl=dist/jupyterlab_gpumem-$version-py3-none-$plat.whl
  [ -f "$whl" ] || { echo "hatch wrote no $whl" >&2; exit 1; }
  "$tools/bin/auditwheel" show "$whl" | tee "$build/$arch/auditwheel-show.txt"
  # Its policy must be manylinux_2_17 or older (the x86_64 binary needs
  # only glibc 2.3's symbols: manylinux_2_5).
  # (auditwheel wraps its lines: read them as one.)
  policy=$(tr -s '\n ' '  ' <"$build/$arch/auditwheel-show.txt" |
    sed -n 's/.*consistent with the following platform tag: "manylinux_\([0-9]*_[0-9]*\)_.*/\1/p')
  [ -n "$policy" ] && [ "$(printf '%s\n2_17\n' "$policy" | sort -t_ -k1,1n -k2,2n | tail -1)" = 2_17 ] \
    || { echo "auditwheel: $whl is not manylinux_2_17 or older (policy ${policy:-none}, see above): the binary needs a newer glibc or an unlisted library" >&2; exit 1; }
  echo "$whl: auditwheel's policy manylinux_$policy, tagged manylinux_2_17"
done
echo
ls -l dist/jupyterlab_gpumem-*.whl

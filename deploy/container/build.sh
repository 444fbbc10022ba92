#!/usr/bin/env bash
# Assembles gpumem's container build context in DIR (default
# .build/container): DIR/rootfs holds /usr/local/bin/gpumem, the shared
# libraries ldd lists for it (at the paths the loader looks for them), an
# /etc/passwd and /etc/group with root and nobody, and empty /proc, /tmp
# and /run/gpumem; DIR/Containerfile is a FROM scratch image of it.
# Build the image where a container engine runs, with no registry pull:
#   docker build -t gpumem:0.1.0 DIR      (or podman build)
# Without one, the rootfs runs as is under chroot (tests/kube does so,
# in new pid and mount namespaces).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.build/container}
rm -rf "$out"
root=$out/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/proc" "$root/tmp" "$root/run/gpumem"
chmod 1777 "$root/tmp"

# -tags kubernetes links client-go for serve --kubernetes. cgo (the NVML
# bindings dlopen libnvidia-ml.so.1 at run time) makes a
# dynamically linked binary; -trimpath keeps build paths out of it.
go build -tags kubernetes -trimpath -ldflags='-s -w' -o "$root/usr/local/bin/gpumem" ./cmd/gpumem

# Each library at the path ldd resolved, plus the loader the binary names.
ldd "$root/usr/local/bin/gpumem" | awk '
	$2 == "=>" && $3 ~ /^\// { print $3 }
	$1 ~ /^\// { print $1 }' | sort -u | while read -r lib; do
	mkdir -p "$root$(dirname "$lib")"
	cp -L "$lib" "$root$lib"
done

printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
cp deploy/container/Containerfile "$out/Containerfile"
echo "build context in $out: $(du -sh "$root" | cut -f1) rootfs; files:"
(cd "$root" && find . -type f | sort)

#!/usr/bin/env bash
# The tools tests/kube runs, each built from its Go module once into a cache
# dir keyed by its version ($GPUMEM_TOOLS_CACHE, else ~/.cache/gpumem):
#
#   bash tests/kube/tools.sh helm           helm, at the version in helm-version
#   bash tests/kube/tools.sh controlplane   kube-apiserver and etcd, at the
#                                           versions controlplane/go.mod pins,
#                                           and the ServiceMonitor's CRD from
#                                           the prometheus-operator module
#
# Each prints the paths it made ready. Sourced (check.sh does), it only
# defines the functions. The Go tests find the same paths.
set -euo pipefail

tools_cache=${GPUMEM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumem}
kube_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# cached_tool NAME VERSION BUILD...: prints $tools_cache/NAME-VERSION, where
# BUILD has put its files (it runs with $out set to a fresh dir). BUILD runs
# only when that dir is not complete yet; a build that fails or is
# interrupted leaves nothing behind, so the next run builds again.
cached_tool() {
  local name=$1 version=$2 dir tmp start
  shift 2
  dir=$tools_cache/$name-$version
  if [ ! -f "$dir/.complete" ]; then
    echo "building $name $version into $dir (once)" >&2
    start=$SECONDS
    mkdir -p "$tools_cache"
    tmp=$(mktemp -d "$tools_cache/.$name-$version.XXXXXX")
    if ! out=$tmp "$@" >&2; then
      rm -rf "$tmp"
      echo "building $name $version failed" >&2
      return 1
    fi
    touch "$tmp/.complete"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    echo "built $name $version in $((SECONDS - start)) s" >&2
  fi
  echo "$dir"
}

# The version of MODULE that controlplane/go.mod requires.
controlplane_version() {
  (cd "$kube_dir/controlplane" && go list -m -f '{{.Version}}' "$1")
}

build_helm() {
  GOBIN=$out go install "helm.sh/helm/v3/cmd/helm@$1"
}

# kube-apiserver reports the release it was built from, as the release
# build's ldflags set it: helm and clients read it from /version.
build_apiserver() {
  local v=k8s.io/component-base/version minor
  minor=$(echo "$1" | cut -d. -f2)
  (cd "$kube_dir/controlplane" && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X $v.gitVersion=$1 -X $v.gitMajor=1 -X $v.gitMinor=$minor" \
    -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
}

build_etcd() {
  (cd "$kube_dir/controlplane" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$out/etcd" go.etcd.io/etcd/server/v3)
}

# The CRDs come with the operator's Go module (its example/ dir), the one
# release of that module the module proxy serves.
fetch_crds() {
  local dir
  dir=$(cd "$kube_dir/controlplane" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$1" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || return 1
  cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" "$out/"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case ${1:-} in
    helm)
      cached_tool helm "$(cat "$kube_dir/helm-version")" build_helm "$(cat "$kube_dir/helm-version")"
      ;;
    controlplane)
      v=$(controlplane_version k8s.io/kubernetes)
      cached_tool kube-apiserver "$v" build_apiserver "$v"
      v=$(controlplane_version go.etcd.io/etcd/server/v3)
      cached_tool etcd "$v" build_etcd
      v=$(cat "$kube_dir/controlplane/prometheus-operator-version")
      cached_tool prometheus-operator-crds "$v" fetch_crds "$v"
      ;;
    *)
      echo "usage: bash tests/kube/tools.sh helm|controlplane" >&2
      exit 2
      ;;
  esac
fi

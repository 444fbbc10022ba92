#!/usr/bin/env bash
# Checks the Helm chart (deploy/helm/gpumem, both modes) and the plain manifests
# rendered from it (deploy/kubernetes): builds helm from its Go module at
# the version in helm-version (once, into a cache dir: tools.sh), runs helm lint and
# helm template, and fails when deploy/kubernetes/*.yaml differ from what
# the chart renders. `check.sh --update` rewrites them. The Go test beside
# this script (helm_test.go, run by go test ./...) then decodes every
# rendered object strictly into k8s.io/api types, using the same helm.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(cat tests/kube/helm-version)
helm=$(bash tests/kube/tools.sh helm)/helm

chart=deploy/helm/gpumem
"$helm" lint --strict "$chart"
"$helm" lint --strict "$chart" --set serviceMonitor.enabled=true
"$helm" lint --strict "$chart" --set mode=notebooks

render() {
	"$helm" template gpumem "$chart" --namespace gpumem "$@"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
	echo "# Rendered from deploy/helm/gpumem by tests/kube/check.sh --update: do not edit."
	echo "# kubectl create namespace gpumem && kubectl apply -n gpumem -f gpumem.yaml"
	render
} >"$tmp/gpumem.yaml"
{
	echo "# Rendered from deploy/helm/gpumem by tests/kube/check.sh --update: do not edit."
	echo "# Needs the prometheus-operator CRDs (monitoring.coreos.com/v1)."
	render --set serviceMonitor.enabled=true --show-only templates/servicemonitor.yaml
} >"$tmp/servicemonitor.yaml"
{
	echo "# Rendered from deploy/helm/gpumem (mode=notebooks) by tests/kube/check.sh --update: do not edit."
	echo "# The daemon reads every pod's connection keys: read deploy/helm/gpumem/README.md's trust model first."
	echo "# kubectl create namespace gpumem && kubectl apply -n gpumem -f gpumem-notebooks.yaml"
	render --set mode=notebooks
} >"$tmp/gpumem-notebooks.yaml"

if [ "${1:-}" = --update ]; then
	cp "$tmp/gpumem.yaml" "$tmp/servicemonitor.yaml" "$tmp/gpumem-notebooks.yaml" deploy/kubernetes/
	echo "deploy/kubernetes rewritten"
	exit 0
fi
for f in gpumem.yaml servicemonitor.yaml gpumem-notebooks.yaml; do
	if ! diff -u "deploy/kubernetes/$f" "$tmp/$f"; then
		echo "deploy/kubernetes/$f differs from what the chart renders: run bash tests/kube/check.sh --update" >&2
		exit 1
	fi
done
echo "helm $version: lint ok, deploy/kubernetes matches the chart"

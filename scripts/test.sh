#!/usr/bin/env bash
# gpumem's test command: installs what the tests need (Debian 12 packages, as
# root; the pinned virtualenvs of today's Jupyter stack), then runs go vet and
# the test suite with the race detector.
#
# End-to-end packages (real kernels and servers) run once per Jupyter stack,
# chosen by GPUMEM_TEST_STACK (see internal/testenv):
#   debian12    Debian 12's packages                 all end-to-end packages
#   current     .venv/current (JupyterLab 4, ...)     all end-to-end packages
#   ipykernel6  .venv/ipykernel6 (ipykernel 6.29)     protocol and magics
# Unit-only packages run once. Integration tests use real Jupyter kernels and
# servers and real PyTorch (Debian's CPU build, which both virtualenvs see
# through --system-site-packages); under CI=true a test that finds them
# missing fails instead of skipping.
#
# GPUMEM_TEST_STACKS="debian12 current" runs a subset of the stacks.
# The extension and the wheels (scripts/test-ui.sh) run in the background
# from the set-up on, and the stacks side by side after the unit packages.
#
#   bash scripts/test.sh          everything (what .ci/run runs)
#   bash scripts/test.sh unit     the fast path: the static checks and the
#                                 unit packages (go test -race), installing
#                                 nothing beyond Go's modules; ruff and the
#                                 injected Python's tests need .venv/current
#                                 (a full run makes it)
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
case $mode in
  all | unit) ;;
  *) echo "usage: bash scripts/test.sh [unit]" >&2; exit 2 ;;
esac

# Each stage's wall time, listed at the end: where the run's time goes.
times=()
stage_start=$SECONDS
lap() {
  times+=("$(printf '%-36s %5d s' "$1" $((SECONDS - stage_start)))")
  stage_start=$SECONDS
}
report_times() {
  printf '== stage times (total %d s, load %s)\n' "$SECONDS" "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf '  %s\n' "${times[@]}"
}

. scripts/lib.sh
command -v go >/dev/null || { echo "go not found: install Go 1.26 or newer"; exit 1; }
command -v gcc >/dev/null || { echo "gcc not found (cgo builds the NVML bindings): apt-get install gcc"; exit 1; }
controlplane_job=""
e2e_bin_dir=""
# Lanes: the extension-and-wheels lane and the end-to-end stacks run in
# the background, side by side and beside the stages, each in a session of
# its own (an early exit ends them all), its output in a log printed whole,
# in order, once it has ended, its time in the stage table. Their tests
# mostly wait on kernels, servers, the browser and deadlines: one at a
# time, they left the two cores idle for most of their stages.
lanes=$(mktemp -d /tmp/gpumem-lanes.XXXXXX)
lane_names=()
lane_jobs=()
# lane NAME CMD...: starts CMD as lane NAME.
lane() {
  local name=$1
  shift
  echo "== $name, in the background (log: $lanes/$name.log)"
  setsid bash -c 'start=$SECONDS; "$@"; rc=$?; echo $((SECONDS - start)) >"$0.seconds"; exit $rc' \
    "$lanes/$name.log" "$@" >"$lanes/$name.log" 2>&1 &
  lane_names+=("$name")
  lane_jobs+=($!)
}
cleanup() {
  local i
  # A lane still running when the script ends early (a failed stage, a
  # timeout): ended, and the end of its log shown.
  for i in "${!lane_jobs[@]}"; do
    [ -n "${lane_jobs[$i]}" ] || continue
    kill -- -"${lane_jobs[$i]}" 2>/dev/null || true
    echo "== ${lane_names[$i]}: ended early; the end of its log"
    tail -n 40 "$lanes/${lane_names[$i]}.log" 2>/dev/null || true
  done
  [ -z "$controlplane_job" ] || kill -- -"$controlplane_job" 2>/dev/null || true
  [ -z "$e2e_bin_dir" ] || rm -rf "$e2e_bin_dir"
  rm -rf "$lanes"
}
trap cleanup EXIT
if [ "$mode" = all ]; then
  # tests/kube's control plane: kube-apiserver and etcd, built from their
  # modules once into the tools cache (cold: minutes of both cores, see
  # deploy/helm/gpumem/README.md). Built in the background from here, over
  # the installs' downloads and the static checks; the end-to-end stage
  # waits for it. Its own session, so an early exit ends all of it.
  controlplane_log=$(mktemp /tmp/gpumem-controlplane.XXXXXX)
  echo "== building the control plane for tests/kube in the background (log: $controlplane_log)"
  setsid bash tests/kube/tools.sh controlplane >"$controlplane_log" 2>&1 &
  controlplane_job=$!
fi
if [ "$mode" = all ]; then
  # Every Debian package of every stage, in one apt run (one index update on
  # a fresh machine), before the wheels' background build: no two apt runs
  # meet. The extension's browser tests need chromium, the wheels' tests
  # (tests/wheel/test.sh) debootstrap, qemu-user, libc6-arm64-cross and
  # binutils.
  # --- Prometheus and JupyterHub (tests/prometheus, tests/hub): Debian's
  # prometheus gives the server the end-to-end test runs on 127.0.0.1 and
  # promtool for the rule unit tests. The tests start the binary themselves on a
  # random port with temporary dirs; they never use the package's service.
  install_missing python3-ipykernel python3-jupyter-client jupyter-notebook python3-jupyter-server python3-torch python3-nbclient python3-venv \
    prometheus chromium debootstrap qemu-user libc6-arm64-cross binutils
  # tests/hub: configurable-http-proxy for the real JupyterHub (JupyterHub itself
  # comes with .venv/current from requirements/current.txt).
  (cd tests/hub && npm ci --no-audit --no-fund --silent)
  # --- end Prometheus and JupyterHub
  make_venv current requirements/current.txt
  make_venv ipykernel6 requirements/ipykernel6.txt
fi
lap "set-up (installs, venvs)"
if [ "$mode" = all ]; then
  # The extension and the wheels share labextension/ and build/, so they
  # go one after the other, in a lane of their own (scripts/test-ui.sh),
  # from here: what the stages below walk (go list ./..., gofmt, ruff)
  # leaves npm's trees and the builds' outputs out.
  lane "the extension and the wheels" bash scripts/test-ui.sh
fi

# go-nvml's cgo bindings wrap every NVML function, the deprecated ones too,
# and gcc warns about each (about 30 lines, none about gpumem's own code):
# keep the build quiet.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"


# --- static checks (gofmt, staticcheck, ruff check and ruff format), the injected Python's unit tests and the GPU-host scripts' hostkit ---
# The tracked files only: npm's trees (one package ships a .go file) are
# rewritten meanwhile by the extension's lane.
unformatted=$(git ls-files -z '*.go' | xargs -0 gofmt -l)
[ -z "$unformatted" ] || { printf 'gofmt -l lists files that need `gofmt -w`:\n%s\n' "$unformatted"; exit 1; }
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
if [ -x .venv/current/bin/ruff ]; then
  .venv/current/bin/ruff check .
  .venv/current/bin/ruff format --check .
  .venv/current/bin/python -m pytest -q -p no:cacheprovider magics/py/tests scripts/gpuhost/test_hostkit.py
elif [ "$mode" = unit ] && [ "${CI:-}" != true ]; then
  echo "no .venv/current (bash scripts/test.sh makes it): ruff and the injected Python's tests not run"
else
  echo ".venv/current has no ruff: build it with make_venv current requirements/current.txt"
  exit 1
fi
# --- end of static checks ---
lap "static checks"

go vet ./...
go vet -tags kubernetes ./cmd/gpumem/cli/ ./sidecar/kube/
# The Helm chart: helm built from its module (once, cached), lint, template,
# and the checked-in manifests must match; tests/kube then uses that helm.
[ "$mode" = unit ] || bash tests/kube/check.sh
lap "go vet, the Helm chart"

e2e=(./protocol/ ./magics/ ./sidecar/discovery/ ./tests/...)
kernel_only=(./protocol/ ./magics/)
mapfile -t unit < <(go list ./... | grep -v -x -e '.*/protocol' -e '.*/magics' -e '.*/sidecar/discovery' -e '.*/tests' -e '.*/tests/.*')

# Every stack runs even when one fails: the summary says which failed.
failed=()
# The unit packages come before the end-to-end lanes: beside them, on a
# cold machine, the load held a kernel's start past its 60 s deadline.
echo "== unit packages"
unit_log=$(mktemp)
go test -race -count=1 -cover -timeout 10m "${unit[@]}" 2>&1 | tee "$unit_log" || failed+=(unit)
# The daemon's state changes are unit-tested: keep its coverage over 70%.
cov=$(awk '$2 ~ /\/sidecar\/daemon$/ { for (i = 1; i <= NF; i++) if ($i ~ /%$/) { sub(/%/, "", $i); print $i } }' "$unit_log")
awk -v c="${cov:-0}" 'BEGIN { exit !(c + 0 >= 70) }' || { echo "sidecar/daemon statement coverage ${cov:-?}% is under 70%"; failed+=(coverage); }
rm -f "$unit_log"
lap "unit packages (go test -race)"
if [ "$mode" = unit ]; then
  report_times
  if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}"
    exit 1
  fi
  echo "unit path passed (the end-to-end packages, the extension and the wheels: bash scripts/test.sh)"
  exit 0
fi
# One race-detector build of gpumem for every end-to-end package and stack
# (each package's TestMain would link its own; testenv.BuildGpumem takes
# GPUMEM_TEST_BIN instead, unless one is given to test another build).
if [ -z "${GPUMEM_TEST_BIN:-}" ]; then
  e2e_bin_dir=$(mktemp -d /tmp/gpumem-e2e-bin.XXXXXX)
  chmod 0755 "$e2e_bin_dir" # the tests run it as other users too
  go build -race -o "$e2e_bin_dir/gpumem" ./cmd/gpumem
  export GPUMEM_TEST_BIN=$e2e_bin_dir/gpumem
  lap "the end-to-end tests' gpumem (-race)"
fi
# The stacks' test binaries are compiled once, first: the stacks then find
# them in the build cache instead of compiling each its own.
go test -race -c -o "$lanes/compiled/" "${e2e[@]}"
lap "the end-to-end tests' binaries (-race)"
# tests/kube runs its control plane (TestChartOnAPIServer): its build must
# be done.
if ! wait "$controlplane_job"; then
  failed+=(controlplane-build)
fi
controlplane_job=""
cat "$controlplane_log"
lap "waiting for the control plane's build"
for stack in ${GPUMEM_TEST_STACKS:-debian12 current ipykernel6}; do
  pkgs=("${e2e[@]}")
  [ "$stack" = ipykernel6 ] && pkgs=("${kernel_only[@]}")
  # -parallel 4: tests/adversarial's scenarios (each with its own daemon,
  # dirs, ports and users) mostly wait on deadlines, so four overlap.
  lane "end-to-end, $stack" env GPUMEM_TEST_STACK="$stack" go test -race -count=1 -timeout 15m -parallel 4 "${pkgs[@]}"
done
for i in "${!lane_names[@]}"; do
  name=${lane_names[$i]}
  wait "${lane_jobs[$i]}" || failed+=("$name")
  lane_jobs[$i]=""
  echo "== $name"
  cat "$lanes/$name.log"
  times+=("$(printf '  %-34s %5s s' "$name" "$(cat "$lanes/$name.log.seconds" 2>/dev/null || echo '?')")")
done
lap "the lanes, side by side"
report_times
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all passed"

#!/usr/bin/env bash
# gpu_host_run.sh: every GPU-host check in one call, on the lent GPU host,
# from the copied checkout's root, with .gpukit (the Debian 12 stack, a cgo
# gpumem and the driver's test binary) and .whl (today's stack) carried.
# Prepare here:
#   gpu-kit's prepare script into .gpukit (the kit's README says how)
#   go build -o .gpukit/gpumem ./cmd/gpumem
#   go test -c -o .gpukit/driver.test ./nvml/driver
#   (wheels: see scripts/gpuhost/gpu_host_current.sh)
# Every step runs even when an earlier one failed. What comes back is a few
# files in $OUT (the device tool returns at most 8): one log per step and the
# example notebook as run there; servers' and daemons' logs stay in /tmp.
# Exit 1 if any check failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT to the folder that comes back}"
RES=$OUT
export GPUMEM_BIN=$PWD/.gpukit/gpumem
mkdir -p /tmp/gpumem-run/debian12 /tmp/gpumem-run/current
rc=0
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$RES/gpus.txt"

echo "== NVML through go-nvml on the real driver"
GPUMEM_TEST_REAL_NVML=1 .gpukit/driver.test -test.run RealNVML -test.v 2>&1 | tee "$RES/real_nvml.txt" || rc=1

echo "== Debian 12's Jupyter stack (gpu-kit)"
if bash .gpukit/setup-on-device; then
  (
    # shellcheck source=/dev/null
    source /tmp/gpukit/env.sh
    export OUT=/tmp/gpumem-run/debian12
    step=0
    python3 scripts/gpuhost/gpu_host_check.py 2>&1 | tee "$RES/gpu_host_check_debian12.txt" || step=1
    python3 scripts/gpuhost/gpu_check.py --mode kernel --notebook examples/leaks.ipynb \
      --notebook-out "$RES/leaks.ipynb" 2>&1 | tee "$RES/gpu_check_debian12.txt" || step=1
    GPUMEM_DRIVER_TEST=$PWD/.gpukit/driver.test python3 scripts/gpuhost/util_check.py 2>&1 \
      | tee "$RES/util_check_debian12.txt" || step=1
    exit $step
  ) || rc=1
else
  rc=1
fi

echo "== today's Jupyter stack (carried wheels)"
OUT=/tmp/gpumem-run/current bash scripts/gpuhost/gpu_host_current.sh 2>&1 | tee "$RES/current.txt" || rc=1
exit $rc

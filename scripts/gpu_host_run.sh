#!/usr/bin/env bash
# gpu_host_run.sh: every GPU-host check in one call, on the lent GPU host,
# from the copied checkout's root, with .gpukit (the Debian 12 stack, a cgo
# gpumem and the driver's test binary) and .whl (today's stack) carried.
# Prepare here:
#   bash ../shared/gpu-kit/prepare .gpukit
#   go build -o .gpukit/gpumem ./cmd/gpumem
#   go test -c -o .gpukit/driver.test ./nvml/driver
#   (wheels: see scripts/gpu_host_current.sh)
# Outputs go to $OUT/{debian12,current}/ and $OUT/*.txt; exit 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder that comes back}"
export GPUMEM_BIN=$PWD/.gpukit/gpumem
mkdir -p "$OUT/debian12" "$OUT/current"
rc=0
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"

echo "== NVML through go-nvml on the real driver"
GPUMEM_TEST_REAL_NVML=1 .gpukit/driver.test -test.run RealNVML -test.v 2>&1 | tee "$OUT/real_nvml.txt" || rc=1

echo "== Debian 12's Jupyter stack (gpu-kit)"
if bash .gpukit/setup-on-device; then
  (
    # shellcheck source=/dev/null
    source /tmp/gpukit/env.sh
    export OUT=$OUT/debian12
    python3 scripts/gpu_host_check.py 2>&1 | tee "$OUT/gpu_host_check.txt" || exit 1
    python3 scripts/gpu_check.py magics/py --mode kernel --notebook examples/leaks.ipynb \
      --notebook-out "$OUT/leaks.ipynb" 2>&1 | tee "$OUT/gpu_check_kernel.txt" || exit 1
  ) || rc=1
else
  rc=1
fi

echo "== today's Jupyter stack (carried wheels)"
OUT=$OUT/current bash scripts/gpu_host_current.sh || rc=1
exit $rc

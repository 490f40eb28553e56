#!/usr/bin/env bash
# The prepared run for a machine with an NVIDIA GPU (docs/CUDA.md, "On a GPU"): what the machine has, the cuda
# backend's GPU tests, bench/gpu.py, then the op suite and the device-parametrized test files on cuda against the
# interp oracle (every test parametrized by device, -k cuda), each stage with its own time limit and the whole within BUDGET seconds (default 400).
# Logs go to $OUT (or /tmp/fnx-gpu). Run from the repository root: bash bench/gpu_check.sh
set -uo pipefail
out=${OUT:-/tmp/fnx-gpu}; mkdir -p "$out"; : > "$out/summary.log"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} FNX_CACHE_DIR=${FNX_CACHE_DIR:-/tmp/fnx-gpu-cache}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
py=${PYTHON:-python3}
start=$(date +%s); budget=${BUDGET:-400}
stage() {  # stage NAME SECONDS COMMAND...: run unless the budget is spent, never past it
  local name=$1 limit=$2; shift 2
  local left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 20 ]; then echo "== $name: skipped, budget spent" | tee -a "$out/summary.log"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  tail -25 "$out/$name.log"
  echo "== $name: exit $rc in $(( $(date +%s) - t0 ))s" | tee -a "$out/summary.log"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $py --version; $py -m pip list 2>/dev/null | grep -i -E "^(cuda-bindings|nvidia-cuda-nvrtc|llvmlite|numpy|ml.dtypes|jax|jaxlib|pytest-timeout) "
  $py -c "import fnx; d = fnx.devices('cuda'); print(d, d[0].device_kind, d[0].target)"; } 2>&1 | tee "$out/env.log"
pytest=(-m pytest -q -rs -p no:cacheprovider --timeout 90)
stage test_cuda 150 env JAX_PLATFORMS=cpu "$py" "${pytest[@]}" -n 4 tests/backends/test_cuda.py tests/backends/test_tensor_cores.py \
  tests/backends/test_grid_lanes.py
stage bench 120 "$py" bench/gpu.py --json "$out/bench.json"
stage test_primitives 150 env JAX_PLATFORMS=cpu FNX_TEST_DEVICES=interp,cuda "$py" "${pytest[@]}" -n 8 \
  tests/backends/test_primitives.py tests/backends/test_casts.py tests/backends/test_low_precision.py
stage test_device_suite 300 env JAX_PLATFORMS=cpu FNX_TEST_DEVICES=cuda "$py" "${pytest[@]}" -n 12 --maxfail=60 \
  -k cuda tests
cat "$out/summary.log"

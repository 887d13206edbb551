#!/usr/bin/env bash
# Build the w4 kernels, run the GEMV GPU tests, then time w4 GEMV vs fp16 cuBLAS vs torch int4
# (M = 1, 2, 4, 8 on the Llama-class shapes). Logs go to $OUT (default ./gemv_out); the last thing
# printed is the table.
#
#     bash kernels/run_gemv_device.sh            # tests + full bench
#     GEMV_BENCH_ARGS="--quick --splits" bash kernels/run_gemv_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gemv_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/w4cache}"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
echo "== build" | tee "$OUT/build.log"
python3 -c "import time, w4cli.kernels as k; t=time.time(); k.load(); print(f'built in {time.time()-t:.0f}s')" 2>&1 | tee -a "$OUT/build.log" || exit 1

echo "== tests"
timeout ${GEMV_TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/test_gemv_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/gemv_tests.log" | grep -E "passed|failed|FAILED|Error|error" | tail -25
tests_rc=${PIPESTATUS[0]}

echo "== bench"
timeout ${GEMV_BENCH_TIMEOUT:-300} python3 kernels/bench_gemv.py --out "$OUT" ${GEMV_BENCH_ARGS:-} 2>&1 | tee "$OUT/gemv_bench.log" | grep -v "^  " | tail -40
if [ "${GEMV_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  echo "== ncu (8192x28672, M=1, variant ${GEMV_NCU_VARIANT:-0})"
  ncu --target-processes all -k regex:gemv_w4a16 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
      python3 -c "
import torch, w4cli.kernels as k
x = torch.randn(1, 8192, device='cuda').half()
q = torch.randint(-2**31, 2**31, (28672 // 8, 64, 8, 16), device='cuda', dtype=torch.int64).int()
z = torch.randint(-2**31, 2**31, (64, 28672 // 8), device='cuda', dtype=torch.int64).int()
s = (torch.rand(64, 28672, device='cuda') * 0.01).half()
k.gemv(x, q, z, s, variant=${GEMV_NCU_VARIANT:-0}); torch.cuda.synchronize()" > "$OUT/ncu.txt" 2>&1
  grep -E "Throughput|Bandwidth|Busy|Achieved Occupancy|Registers|Issued|Eligible|Active Warps|Stall|Duration|One or More|No Eligible" "$OUT/ncu.txt" | head -40
fi
if [ "${GEMV_SASS:-0}" = 1 ]; then
  so=$(ls "$XDG_CACHE_HOME"/w4/kernels/*/*.so | head -1)
  cuobjdump -sass "$so" > "$OUT/gemv_sass.txt" 2>&1 && gzip -f "$OUT/gemv_sass.txt"
fi
echo "tests exit code: $tests_rc"
exit $tests_rc

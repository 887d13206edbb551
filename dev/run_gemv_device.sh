#!/usr/bin/env bash
# Build the w4 kernels, run the GEMV GPU tests, then time w4 GEMV vs fp16 cuBLAS vs torch int4
# (M = 1, 2, 4, 8 on the Llama-class shapes). Logs go to $OUT (default ./gemv_out); the last thing
# printed is the table.
#
#     bash dev/run_gemv_device.sh            # tests + full bench
#     GEMV_BENCH_ARGS="--quick --splits" bash dev/run_gemv_device.sh
#     GEMV_NCU=1 bash dev/run_gemv_device.sh     # + Nsight Compute on one launch (8192x28672, M=1)
#     GEMV_SASS=1 bash dev/run_gemv_device.sh    # + the built kernels' SASS
#     GEMV_TEST_ARGS="-x" (extra pytest args), GEMV_BENCH_ARGS="--no-peers --splits" (split sweep only)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gemv_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
echo "== build" | tee "$OUT/build.log"
python3 -c "import time, w4cli.gpu.kernels as k; t=time.time(); k.load(); print(f'built in {time.time()-t:.0f}s')" 2>&1 | tee -a "$OUT/build.log" || exit 1

echo "== tests"
timeout ${GEMV_TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu tests/test_gemv_gpu.py -p no:cacheprovider ${GEMV_TEST_ARGS:-} 2>&1 | tee "$OUT/gemv_tests.log" | grep -E "passed|failed|FAILED|Error|error" | tail -25
tests_rc=${PIPESTATUS[0]}

echo "== bench"
timeout ${GEMV_BENCH_TIMEOUT:-300} python3 dev/bench_gemv.py --out "$OUT" ${GEMV_BENCH_ARGS:-} 2>&1 | tee "$OUT/gemv_bench.log" | grep -v "^  " | tail -40
if [ "${GEMV_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  # one launch of the default kernel (8192x28672, M=1, the bench's random layer); counters as found
  # (--clock-control none: the clocks are left alone)
  cat > "$OUT/ncu_gemv.py" <<PY
import torch
from w4cli.gpu import kernels
from w4cli.bench.cases import Layer
layer = Layer(8192, 28672, 128, seed=1)
kernels.gemv(layer.x(1, 0), *layer.gemv(0))
torch.cuda.synchronize()
PY
  echo "== ncu (8192x28672, M=1)"
  timeout ${GEMV_NCU_TIMEOUT:-150} ncu --clock-control none --target-processes all -k regex:gemv_w4a16 -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section MemoryWorkloadAnalysis_Chart --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section LaunchStats --section SourceCounters --section InstructionStats \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,smsp__inst_executed.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum \
      --import-source no -o "$OUT/gemv_prof" -f python3 "$OUT/ncu_gemv.py" > "$OUT/ncu_run.log" 2>&1
  ncu -i "$OUT/gemv_prof.ncu-rep" --page details > "$OUT/ncu.txt" 2>&1
  ncu -i "$OUT/gemv_prof.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip > "$OUT/ncu_src.csv.gz"
  grep -E "gemv_w4a16|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|L1/TEX Hit|L2 Hit|Stall Long|dram__bytes_read|Executed Ipc A|Block Size|Grid Size" "$OUT/ncu.txt" | head -80
fi
if [ "${GEMV_SASS:-0}" = 1 ]; then
  so=$(ls "${XDG_CACHE_HOME:-$HOME/.cache}"/w4/kernels/*/*.so | head -1)
  cuobjdump -sass "$so" > "$OUT/gemv_sass.txt" 2>&1 && gzip -f "$OUT/gemv_sass.txt"
fi
echo "tests exit code: $tests_rc"
exit $tests_rc

#!/usr/bin/env bash
# Where the M = 9-32 calls go, in one call on a GPU machine: Nsight Compute's counters (DRAM and
# L2-to-SM bytes, L1 hit rate, occupancy, warp states) for one launch of each kernel on NCU_SHAPES
# at NCU_M, then `bench_batch.py` over the kernels that can take those M (SWEEP_SHAPES x SWEEP_M,
# SWEEP_KERNELS, their automatic split). Logs go to $OUT.
#
#     OUT=/tmp/small NCU_SHAPES=4096x6144 NCU_M="1 8 16" SWEEP_SHAPES=4096x6144 SWEEP_M=9,16 bash dev/run_small_m_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/small_m_out}"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
python3 -c "import w4cli.gpu.kernels as k; k.load()" || exit 1
for shape in ${NCU_SHAPES:-4096x6144 4096x4096 14336x4096}; do
  timeout 240 ncu --clock-control none -k regex:'gemv|gemm' \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,l1tex__t_sector_hit_rate.pct \
    python3 dev/probes/batch_once.py --shape "$shape" --kernels "${NCU_KERNELS:-0,1,2}" ${NCU_M:-1 8 16} \
    > "$OUT/ncu_$shape.txt" 2>&1
  echo "ncu $shape rc=$? $(date -u +%H:%M:%S)"
  grep -E '^  [a-z_]+.*\(|Duration|dram__bytes_read|srcunit_tex|sector_hit|Registers Per|Achieved Occupancy|Grid Size|Block Size|Stall' "$OUT/ncu_$shape.txt" | head -120
done
if [ -n "${SWEEP_SHAPES:-}" ]; then
  timeout "${SWEEP_TIMEOUT:-300}" python3 dev/bench_batch.py --shapes "$SWEEP_SHAPES" --m "${SWEEP_M:-9,16}" \
    --kernels "${SWEEP_KERNELS:-0,1,2}" --tiles "${SWEEP_TILES:-1,2}" --splits "${SWEEP_SPLITS:-}" 2>&1 | tee "$OUT/sweep.txt"
fi

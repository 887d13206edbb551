#!/usr/bin/env bash
# One device call for the small-M and per-SM questions of issue 23: build, the GEMV's tests (token
# tiles up to 32 rows), the GEMV at M = 9..32 against the batch paths, the warp-specialised kernel's
# variants and split counts on the 4096-wide layers, and Nsight Compute's warp-state sampling of
# the warp-specialised kernel (per SASS instruction). Everything goes to $OUT.
#
#     OUT=/tmp/tiles bash dev/run_tiles_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/tiles_out}"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$log"
python3 -c "import time, w4cli.gpu.kernels as k; t=time.time(); k.load(); print(f'built in {time.time()-t:.0f}s')" 2>&1 | tail -30 | tee -a "$log" || exit 1
timeout 200 python3 -m pytest -q -m gpu tests/test_gemv_gpu.py -p no:cacheprovider -x 2>&1 | tail -15 | tee -a "$log"

echo "== GEMV token tiles against the batch paths" | tee -a "$log"
timeout 150 python3 dev/bench_batch.py --shapes ${TILES_SHAPES:-4096x4096,4096x6144,4096x14336,14336x4096,8192x8192,8192x28672,28672x8192} \
    --m 9,16,24,32 --kernels 0,1,2 --tiles 0 --splits 2,4,8 2>&1 | tee -a "$log" | grep -E "auto|best|dequant"

echo "== warp-specialised variants and splits on the 4096-wide layers" | tee -a "$log"
timeout 170 python3 dev/bench_batch.py --shapes 4096x4096,4096x6144,14336x4096,4096x14336 --m 64,128,256,512 \
    --kernels 2,3 --tiles 1,2,3,4,5 --splits 2,3,4 2>&1 | tee -a "$log" | grep -E "auto|best|dequant"

echo "== Nsight Compute: the warp-specialised kernel, 8192x28672, M = 1024" | tee -a "$log"
so=$(ls ~/.cache/w4/kernels/*/*.so | head -1)
cuobjdump -sass "$so" > "$OUT/all.sass" 2>&1
python3 - "$OUT/all.sass" > "$OUT/ws.sass" <<'EOF'
import sys
text = open(sys.argv[1]).read().split("Function : ")
for part in text:
    if "gemm_w4a16_ws_kernelILi256ELi1E" in part.split("\n", 1)[0]:
        print("Function : " + part)
EOF
rm -f "$OUT/all.sass"
timeout 150 ncu --clock-control none -k regex:gemm_w4a16_ws --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
    --import-source no -o "$OUT/ws1024" -f python3 dev/probes/batch_once.py 1024 > "$OUT/ncu_run.txt" 2>&1
echo "ncu rc=$?" | tee -a "$log"
ncu --import "$OUT/ws1024.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
ncu --import "$OUT/ws1024.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source.csv" 2>&1
echo "source page rc=$? lines $(wc -l < "$OUT/ncu_source.csv")" | tee -a "$log"
rm -f "$OUT/ws1024.ncu-rep"
ls -la "$OUT" | tee -a "$log"

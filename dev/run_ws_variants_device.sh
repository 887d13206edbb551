#!/usr/bin/env bash
# The warp-specialised kernel's variants after a change to its pipeline, in one call: build, a
# hang-guarded first run of every variant, the sweep against fp16 cuBLAS, the batch tests, then
# memcheck and racecheck on the variants named in WS_SANITIZE. Logs go to $OUT.
#
#     OUT=/tmp/ws WS_TILES=1,3,4,5 WS_SPLITS=1,2,4 WS_SANITIZE="1 3 5" bash dev/run_ws_variants_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/ws_out}"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$log"
python3 -c "import time, w4cli.gpu.kernels as k; t=time.time(); k.load(); print(f'built in {time.time()-t:.0f}s')" 2>&1 | tail -30 | tee -a "$log" || exit 1
timeout 90 python3 dev/probes/batch_sanitize.py 2>&1 | tail -5 | tee -a "$log"
echo "first run rc=${PIPESTATUS[0]}" | tee -a "$log"
echo "== sweep" | tee -a "$log"
timeout ${WS_SWEEP_S:-260} python3 dev/bench_batch.py --shapes ${WS_SHAPES:-8192x28672,28672x8192,8192x8192,4096x14336,14336x4096,4096x4096,4096x6144} \
    --m ${WS_M:-256,512,1024,4096} --kernels ${WS_KERNELS:-3} --tiles ${WS_TILES:-3,5} --splits "${WS_SPLITS:-}" 2>&1 | tee -a "$log" | grep -vE "^    "
echo "== tests" | tee -a "$log"
timeout 150 python3 -m pytest -q -m gpu tests/test_batch_gpu.py -p no:cacheprovider -x 2>&1 | tail -5 | tee -a "$log"
for tool in racecheck memcheck; do
  timeout 100 compute-sanitizer --tool $tool --print-limit 5 python3 dev/probes/batch_sanitize.py ${WS_SANITIZE:-1 3 5} > "$OUT/sanitize_$tool.txt" 2>&1
  echo "$tool rc=$? $(tail -2 "$OUT/sanitize_$tool.txt" | tr '\n' ' ')" | tee -a "$log"
done

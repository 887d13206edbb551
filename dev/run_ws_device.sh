#!/usr/bin/env bash
# The warp-specialised wgmma kernel on a Hopper GPU, in one call: build, its GPU tests, memcheck and
# racecheck on small odd shapes, the batch sweep (its variants, dequantize + cuBLAS) against fp16
# cuBLAS from M = 256 to 4096, then the Llama decode steps. Logs go to $OUT.
#
#     OUT=/tmp/ws bash dev/run_ws_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/ws_out}"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import time, w4cli.gpu.kernels as k; t=time.time(); k.load(); print(f'built in {time.time()-t:.0f}s')" 2>&1 | tail -30 || exit 1
timeout 240 python3 -m pytest -q -m gpu tests/test_batch_gpu.py -p no:cacheprovider -x 2>&1 | tee "$OUT/tests.txt" | tail -3
tests_rc=${PIPESTATUS[0]}
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --print-limit 5 python3 dev/probes/batch_sanitize.py > "$OUT/sanitize_$tool.txt" 2>&1
  echo "$tool rc=$? $(tail -2 "$OUT/sanitize_$tool.txt" | tr '\n' ' ')"
done
SHAPES=${WS_SHAPES:-8192x28672,8192x8192,4096x4096,28672x8192,4096x14336,14336x4096,4096x6144}
timeout 330 python3 dev/bench_batch.py --shapes $SHAPES --m ${WS_M:-256,512,1024,4096} --kernels 3 --tiles 3,5 \
    --splits "" 2>&1 | tee "$OUT/bench_large.txt" | grep -v "^    "
exit $tests_rc

#!/usr/bin/env bash
# Build the w4 kernels, run the batch kernels' GPU tests, then sweep their settings (kernel, row
# tiles, split-K) against fp16 cuBLAS and the automatic choice (dev/bench_batch.py). Logs go to $OUT.
#
#     OUT=/tmp/batch bash dev/run_batch_device.sh
#     BATCH_BENCH_ARGS="--shapes 8192x8192 --m 16" bash dev/run_batch_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/batch_out}"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -c "import time, w4cli.gpu.kernels as k; t=time.time(); k.load(); print(f'built in {time.time()-t:.0f}s')" 2>&1 | tail -30 || exit 1
timeout 300 python3 -m pytest -q -m gpu tests/test_batch_gpu.py -p no:cacheprovider 2>&1 | tail -4
tests_rc=${PIPESTATUS[0]}
timeout 400 python3 dev/bench_batch.py --shapes 8192x28672,8192x8192,4096x14336 --m 16,32,64,128 \
    --splits 1,2,4 --tiles 1,2 ${BATCH_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_batch.txt" | grep -v "^    "
exit $tests_rc

#!/usr/bin/env bash
# dev/run_device.sh: on a GPU machine, from the repo root: build the kernels, run the GPU tests,
# time the dequantize kernel. Logs go to $OUT (default ./device-out). Usage:
#   dev/run_device.sh [--quick]     (extra args go to dev/bench_dequant.py)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/device-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$OUT/gpu.txt"
t0=$(date +%s)
"$PY" -c "import w4cli.gpu.kernels as k; k.load(); print('build ok')" 2>&1 | tee "$OUT/build.txt"; rc_build=${PIPESTATUS[0]}
echo "build: rc=$rc_build, $(( $(date +%s) - t0 )) s"
if [ "$rc_build" -ne 0 ]; then cat ~/.cache/w4/kernels/*/build.log 2>/dev/null | tail -60 | tee -a "$OUT/build.txt"; exit 3; fi
"$PY" -m pytest -q -m gpu tests/test_kernels_gpu.py -x -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -25
rc_test=${PIPESTATUS[0]}
echo "pytest gpu: rc=$rc_test"
"$PY" dev/bench_dequant.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.txt"; rc_bench=${PIPESTATUS[0]}
echo "bench: rc=$rc_bench; total $(( $(date +%s) - t0 )) s"
[ "$rc_test" -eq 0 ] && [ "$rc_bench" -eq 0 ]

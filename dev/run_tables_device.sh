#!/usr/bin/env bash
# The release tables on a GPU machine: `make test-gpu`, `w4 bench` on the seven Llama shapes at the
# issue's batch sizes (markdown, for docs/performance.md) in two groups, and the Llama-3-8B and -70B
# decode steps. PARTS picks which (default all; at the steady-state timing all of them take longer
# than one 10-minute device call: split them over calls). Everything goes to $OUT.
#
#     OUT=/tmp/tables PARTS=test,small,large bash dev/run_tables_device.sh
#     OUT=/tmp/tables PARTS=8b,70b bash dev/run_tables_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/tables_out}"
PARTS=",${PARTS:-test,small,large,8b,70b},"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
python3 -c "import w4cli.gpu.kernels as k; k.load()" || exit 1
BATCH=1,16,32,64,128,256,512,1024,4096
if [[ $PARTS == *,test,* ]]; then
  timeout 300 make test-gpu 2>&1 | tee "$OUT/test_gpu.txt" | tail -4
fi
for part in small large; do
  [[ $PARTS == *,$part,* ]] || continue
  if [ $part = small ]; then group="4096x4096 4096x6144 4096x14336 14336x4096"; else group="8192x8192 8192x28672 28672x8192"; fi
  args=(); for s in $group; do args+=(--shape "$s"); done
  timeout 400 python3 -m w4cli bench "${args[@]}" --batch $BATCH --markdown > "$OUT/bench_$part.md" 2> "$OUT/bench_$part.err"
  echo "bench $group rc=$? $(date -u +%H:%M:%S)"
done
for model in 8b 70b; do
  [[ $PARTS == *,$model,* ]] || continue
  timeout 400 python3 -m w4cli bench "tests/data/llama-3-$model" --batch 1,16,64,128,256 --markdown > "$OUT/step_$model.md" 2> "$OUT/step_$model.err"
  echo "llama-3-$model rc=$? $(date -u +%H:%M:%S)"; grep -iE "step|total" "$OUT/step_$model.md" | head -12
done

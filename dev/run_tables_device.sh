#!/usr/bin/env bash
# The release tables on a GPU machine, in one call: `make test-gpu`, then `w4 bench` on the seven
# Llama shapes at the issue's batch sizes (markdown, for docs/performance.md); with --steps, the
# Llama-3-8B and -70B decode steps instead of the shapes. Everything goes to $OUT.
#
#     OUT=/tmp/tables bash dev/run_tables_device.sh [--steps]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/tables_out}"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
BATCH=1,16,32,64,128,256,512,1024,4096
if [ "${1:-}" = "--steps" ]; then
  python3 -c "import w4cli.gpu.kernels as k; k.load()" || exit 1
  for model in llama-3-8b llama-3-70b; do
    timeout 240 python3 -m w4cli bench "tests/data/$model" --batch 1,16,64,128,256 --markdown > "$OUT/step_$model.md" 2> "$OUT/step_$model.err"
    echo "$model rc=$?"; grep -iE "step|total" "$OUT/step_$model.md" | head -12
  done
  exit 0
fi
timeout 220 make test-gpu 2>&1 | tee "$OUT/test_gpu.txt" | tail -4
for group in "4096x4096 4096x6144 4096x14336 14336x4096" "8192x8192 8192x28672 28672x8192"; do
  args=(); for s in $group; do args+=(--shape "$s"); done
  name=$(echo "$group" | cut -d' ' -f1)
  timeout 280 python3 -m w4cli bench "${args[@]}" --batch $BATCH --markdown > "$OUT/bench_$name.md" 2> "$OUT/bench_$name.err"
  echo "bench $group rc=$?"
done

#!/usr/bin/env bash
# Where a batch kernel's warps wait, in one call: build, the SASS of the batch kernels, then Nsight
# Compute (full set, per-instruction warp-state samples) on one launch at each PROFILE_M of
# PROFILE_SHAPE (8192x28672 unless set), exported as text: details_M.txt (every section) and
# sass_M.csv.gz (the source page: each SASS instruction with its samples by stall reason). Logs
# go to $OUT. PROFILE_KERNEL picks the kernel (batch_once.py's numbers: 1 mma.sync, 2 the barrier
# wgmma kernel, 3 the warp-specialised one, the default) and PROFILE_TILES its tiling or variant
# (0, the default: the planner's).
#
#     OUT=/tmp/prof PROFILE_M="4096 256" [PROFILE_SHAPE=4096x14336] [PROFILE_KERNEL=2 PROFILE_TILES=2] bash dev/run_profile_device.sh
# PROFILE_SWEEP, if set, is passed to dev/bench_batch.py afterwards (e.g. "--m 16 --kernels 2").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/profile_out}"
mkdir -p "$OUT"
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/w4cache}"
log="$OUT/log.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$log"
python3 -c "import time, w4cli.gpu.kernels as k; t=time.time(); k.load(); print(f'built in {time.time()-t:.0f}s')" 2>&1 | tail -30 | tee -a "$log" || exit 1
so="$(find "$XDG_CACHE_HOME/w4/kernels" -name '*.so' | head -1)"
cuobjdump -sass "$so" 2>>"$log" | gzip > "$OUT/sass_all.txt.gz"
echo "sass: $(zcat "$OUT/sass_all.txt.gz" | wc -l) lines" | tee -a "$log"
kernel="${PROFILE_KERNEL:-3}"
name=$(case $kernel in 1) echo gemm_w4a16_batch_kernel;; 2) echo gemm_w4a16_wgmma_kernel;; *) echo gemm_w4a16_ws_kernel;; esac)
for m in ${PROFILE_M:-4096 256}; do
  rep="/tmp/prof_$m"
  timeout 200 ncu --clock-control none --set full --import-source yes -k "regex:$name" -c 1 -f -o "$rep" \
      python3 dev/probes/batch_once.py --shape "${PROFILE_SHAPE:-8192x28672}" --kernels "$kernel" \
      --tiles "${PROFILE_TILES:-0}" "$m" >>"$log" 2>&1
  echo "ncu M=$m rc=$?" | tee -a "$log"
  ncu -i "$rep.ncu-rep" --page details > "$OUT/details_$m.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/sass_$m.csv.gz"
done
if [ -n "${PROFILE_SWEEP:-}" ]; then
  echo "== sweep $PROFILE_SWEEP" | tee -a "$log"
  timeout 200 python3 dev/bench_batch.py $PROFILE_SWEEP 2>&1 | tee -a "$log" | grep -vE "^    "
fi

#!/usr/bin/env bash
# Kernel trees side by side on a Hopper GPU, in one call: every tree built at once (the shipped one,
# each DIR, the shipped one with each of CMP_ARGS' --patches, and the shipped one with the timeline
# probe's stamps), `make test-gpu` meanwhile unless
# TEST_GPU=0, then the timeline probe on TL_CELLS and compare_builds on CMP_SHAPES x CMP_M (CMP_ARGS:
# its other flags, e.g. "--kernel 2"). CMP_PREBUILD names more patches to build meanwhile, for a
# later run of this script in the same call (TEST_GPU=0; a tree built before is not rebuilt). Logs
# go to $OUT: the builds' in full only where one failed, since the device returns a few files.
#
#     OUT=/tmp/cmp CMP_SHAPES=4096x4096 CMP_M=256,512 TL_CELLS=4096x4096:256 bash dev/run_compare_device.sh [DIR ...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/compare_out}"
mkdir -p "$OUT"
BUILD_LOGS=$(mktemp -d)
export PYTHONPATH=$PWD:$PWD/dev/probes HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.limit --format=csv | tee "$OUT/gpu.txt"
build() {  # name, tree, patches ("", "timeline" or a name of compare_builds.PATCHES)
  python3 - "$@" <<'EOF' > "$BUILD_LOGS/$1.txt" 2>&1
import sys, time
from pathlib import Path
from ws_ablation import build_tree
name, tree, patches = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if patches == "timeline":
    from ws_timeline import PATCHES as p
elif patches:
    from compare_builds import PATCHES
    p = PATCHES[patches]
else:
    p = []
t = time.time()
build_tree(name, tree, p)
print(f"built {name} in {time.time() - t:.0f}s")
EOF
  local rc=$?
  echo "build $1 rc=$rc $(tail -1 "$BUILD_LOGS/$1.txt")"
  # the whole log only where it failed: $OUT comes back with a few files at most
  [ $rc = 0 ] || { echo "== $1"; cat "$BUILD_LOGS/$1.txt"; } >> "$OUT/build_failures.txt"
}
build shipped kernels "" &
for d in "$@"; do build "$(basename "$d")" "$d" "" & done
[ -n "${TL_CELLS:-}" ] && build timeline_kernels kernels timeline &
patches="$(sed -n 's/.*--patches[ =]\([^ ]*\).*/\1/p' <<<"${CMP_ARGS:-}"),${CMP_PREBUILD:-}"
for p in ${patches//,/ }; do build "$p" kernels "$p" & done
if [ "${TEST_GPU:-1}" = 1 ]; then
  timeout 330 make test-gpu > "$OUT/test_gpu.txt" 2>&1
  echo "test-gpu rc=$? $(tail -1 "$OUT/test_gpu.txt")"
fi
wait
if [ -n "${TL_CELLS:-}" ]; then
  timeout 120 python3 dev/probes/ws_timeline.py --cells "$TL_CELLS" --launches 8 2>&1 | tee "$OUT/timeline.txt" | grep -v '^ '
fi
if [ $# -gt 0 ] || [[ "${CMP_ARGS:-}" == *--patches* ]]; then
  timeout "${CMP_TIMEOUT:-240}" python3 dev/probes/compare_builds.py "$@" --shapes "${CMP_SHAPES:-4096x4096}" \
      --m "${CMP_M:-256}" --reps "${CMP_REPS:-2}" ${CMP_ARGS:-} 2>&1 | tee "$OUT/compare.txt" | grep -v '^ '
fi

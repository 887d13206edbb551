#!/usr/bin/env bash
# kernels/check.sh: compile every kernels/*.cu with nvcc for sm_80, sm_90 and sm_90a (no GPU needed), report
# registers and spills from ptxas (-Xptxas -v), and fail on any local-memory spill or serialised wgmma.
# The .cu files are torch-free, so no torch include paths are needed; ops.cpp is not compiled here
# (the JIT build in w4cli/gpu/kernels.py compiles it). Usage: kernels/check.sh [arch ...]  (default 80 90 90a)
# One line per file and arch (kernel count, most registers, spill bytes); V=1 lists every kernel
# (registers, barriers, stack, spills). A failed compile or a spill always prints in full.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v nvcc >/dev/null || { echo "check.sh: nvcc not found on PATH" >&2; exit 3; }
archs=("$@"); [ ${#archs[@]} -gt 0 ] || archs=(80 90 90a)
verbose="${V:-0}"; [ "$verbose" = 0 ] && verbose=""
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
status=0
shopt -s nullglob
for cu in "$here"/*.cu; do
  for a in "${archs[@]}"; do
    log="$tmp/$(basename "$cu" .cu).sm_$a.log"
    # Same flags as the JIT build (w4cli/gpu/kernels.py): -O3, no --use_fast_math (bit-exactness).
    if ! nvcc -std=c++17 -O3 -gencode "arch=compute_$a,code=sm_$a" -Xptxas -v -I"$here" \
         -c "$cu" -o "$tmp/out.o" >"$log" 2>&1; then
      echo "FAIL compile $(basename "$cu") sm_$a"; cat "$log"; status=1; continue
    fi
    # ptxas prints "Compiling entry function 'X'" / "Function properties for X", then the
    # stack/spill line and the "Used N registers" line.
    if [ -n "$verbose" ]; then
      awk -v f="$(basename "$cu")" -v a="$a" '
        /Function properties for/ { name=$NF }
        /bytes spill stores/ { spill=$0 }
        /Used [0-9]+ registers/ {
          regs=$0; sub(/.*Used /, "", regs);
          printf "%-20s sm_%s  %s  %s |%s\n", f, a, name, regs, spill
        }' "$log" | { if command -v c++filt >/dev/null; then c++filt; else cat; fi; } \
        | sed -E 's/void w4::\(anonymous namespace\):://; s/\(unsigned int const\*[^)]*\)//; s/\([^)]*\)  / /; s/ bytes stack frame,/B stack,/; s/ bytes spill (stores|loads)/ spill \1/g'
    else
      awk -v f="$(basename "$cu")" -v a="$a" '
        /bytes spill stores/ {
          for (i = 1; i < NF; i++) if ($(i + 1) == "bytes" && $(i + 2) == "spill") spill += $i
        }
        /Used [0-9]+ registers/ {
          kernels++; regs = $0; sub(/.*Used /, "", regs); regs += 0
          if (regs > most) most = regs
        }
        END { printf "%-20s sm_%s  %d kernels, registers max %d, spills %d bytes\n", f, a, kernels, most, spill }' "$log"
    fi
    if grep -Eq '[1-9][0-9]* bytes spill (stores|loads)' "$log"; then
      echo "FAIL spills in $(basename "$cu") sm_$a:"; grep -B2 -E '[1-9][0-9]* bytes spill' "$log"; status=1
    fi
    if grep -Eiq 'warning' "$log"; then grep -i warning "$log"; fi
    # ptxas serialises a kernel's wgmmas (each waits for the one before) when it cannot prove their
    # registers untouched mid-flight; it says so under several codes (C7513, C7515, ...), one phrase
    if grep -q 'wgmma.mma_async instructions are serialized' "$log"; then
      echo "FAIL serialized wgmma in $(basename "$cu") sm_$a:"; grep 'wgmma.mma_async instructions are serialized' "$log"
      status=1
    fi
  done
done
[ $status -eq 0 ] && echo "check.sh: all kernels compiled for sm_${archs[*]}, no spills"
exit $status

"""The instruction mix of each kernel's innermost loop that holds wgmmas, from SASS, with no GPU (lab
only): what a kernel change does to a k-block's instruction stream can be counted here before any
device time is spent on it.

    nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I kernels -c kernels/gemm_w4a16_wgmma.cu -o /tmp/w.o
    cuobjdump -sass /tmp/w.o > /tmp/w.sass
    python3 dev/probes/sass_loop.py /tmp/w.sass [ws_kernel ...] [--ops]

cuobjdump and the nvdisasm it calls are not in the CPU machine's CUDA install: the PyPI wheels
`nvidia-cuda-cuobjdump` and `nvidia-cuda-nvdisasm` carry both (`pip download --no-deps
--only-binary=:all: ...`, unzip, put their nvidia/cu13/bin on PATH).

Per kernel whose name holds one of the given substrings: the smallest loop (a backward branch) that
holds at least 8 HGMMA, its instruction count, HGMMA, the integer-pipe (ALU) and fp-pipe (FMA)
instructions, shared-memory loads and uniform-datapath ones; --ops adds the opcode histogram.
"""

from __future__ import annotations

import argparse
import collections
import re

ALU = ("LOP3", "SHF", "IADD3", "LEA", "ISETP", "SEL", "PRMT", "MOV", "VIADD", "IMNMX")
FMA = ("HADD2", "HMUL2", "HFMA2", "IMAD", "FADD", "FFMA", "FMUL")


def loops(sass: str, names: list[str]):
    """(kernel name, opcode counter) of the innermost HGMMA loop of each matching kernel."""
    for func in re.split(r"\n\s*Function : ", sass)[1:]:
        name = func.split("\n", 1)[0].strip()
        if names and not any(n in name for n in names):
            continue
        ins = [(int(m.group(1), 16), m.group(2).strip())
               for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", func)]
        hgmma = [a for a, s in ins if "HGMMA" in s]
        best = None
        for addr, text in ins:
            target = re.search(r"BRA\s.*0x([0-9a-f]+)", text)
            if not target:
                continue
            lo = int(target.group(1), 16)
            inner = best is None or addr - lo < best[1] - best[0]
            if lo < addr and sum(lo <= h <= addr for h in hgmma) >= 8 and inner:
                best = (lo, addr)
        if best is None:
            continue
        ops = collections.Counter()
        for addr, text in ins:
            if best[0] <= addr <= best[1]:
                ops[re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]] += 1
        yield name, ops


def kernel_name(mangled: str) -> str:
    """kernel<template arguments> out of a mangled name (its length-prefixed identifier ending in
    _kernel, then the integer arguments), or the mangled name's start."""
    for run in re.finditer(r"\d+", mangled):
        for k in range(len(run.group())):
            length, at = int(run.group()[k:]), run.end()
            ident = mangled[at:at + length]
            if ident.endswith("_kernel") and mangled[at + length:at + length + 1] == "I":
                args = re.findall(r"L[ib](\d+)E", mangled[at + length:])
                return f"{ident}<{','.join(args)}>"
    return mangled[:60]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("names", nargs="*", help="substrings of the kernels' mangled names (all if none)")
    ap.add_argument("--ops", action="store_true", help="the loop's opcode histogram too")
    args = ap.parse_args()
    for name, ops in loops(open(args.sass).read(), args.names):
        short = kernel_name(name)
        print(f"{short:36s} n={sum(ops.values()):4d} hgmma={ops['HGMMA']:3d} alu={sum(ops[o] for o in ALU):4d} "
              f"fma={sum(ops[o] for o in FMA):4d} lds={ops['LDS']:3d} "
              f"uniform={sum(v for k, v in ops.items() if k.startswith('U')):3d}")
        if args.ops:
            print("    " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time CPU dequantization of one layer (default 4096x14336, G = 128) to fp16 and bf16: w4's CPU kernel
(AVX2 and scalar) against the pure-torch reference, on 1 thread and on all, in each packed layout
(AWQ, GPTQ, compressed-tensors), beside a plain copy of the output's bytes into a fresh tensor.
Each kernel output is compared bit for bit with the reference before it is timed. GB/s = output
bytes / median seconds.

Usage: PYTHONPATH=. python3 dev/bench_cpu_dequant.py [--shape 4096x14336] [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

import torch

from w4cli.cpu import kernel
from w4cli.formats import awq_gemm, compressed_tensors, gptq
from w4cli.formats.packed import PackedLinear


def words(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31, shape, generator=generator, dtype=torch.int64).to(torch.int32)


def layers(k: int, n: int, group: int) -> dict[str, PackedLinear]:
    """One random layer per format, packed as its checkpoints store it (full 32-bit words)."""
    gen = torch.Generator().manual_seed(0)
    groups = k // group
    scales16 = (torch.rand(groups, n, generator=gen) * 0.01 + 0.002).half()
    awq = awq_gemm.packed_linear(words(gen, k, n // 8), words(gen, groups, n // 8), scales16)
    gq = gptq.packed_linear(words(gen, k // 8, n), words(gen, groups, n // 8), scales16, None, group, v1=True)
    from w4cli.read.ct_config import WeightArgs

    args = WeightArgs(symmetric=True, strategy="group", group_size=group)
    ct = compressed_tensors.packed_linear(words(gen, n, k // 8), scales16.t().contiguous().bfloat16(), None, None, (n, k), args)
    return {"AWQ": awq, "GPTQ": gq, "compressed-tensors": ct}


def seconds(fn, repeats: int) -> tuple[float, float]:
    """(median, min) over `repeats` calls after one warm-up; each output is freed before the next
    call, as `w4 dequantize` frees each once written."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
        del out
    return statistics.median(times), min(times)


def row(label: str, fmt: str, dtype: str, threads: int, times: tuple[float, float], out_bytes: int) -> str:
    median, best = times
    return f"| {label} | {fmt} | {dtype} | {threads} | {median * 1e3:.1f} ({best * 1e3:.1f}) | {out_bytes / median / 1e9:.2f} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x14336", help="K x N")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="AWQ fp16 only, no reference")
    a = ap.parse_args()
    k, n = (int(x) for x in a.shape.split("x"))
    all_threads = len(os.sched_getaffinity(0))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    print(f"# {cpu}, {all_threads} threads, torch {torch.__version__}, AVX2 path: {kernel.load().has_avx2()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {k}x{n} G={a.group}")
    out_bytes = k * n * 2
    src = torch.empty(k * n, dtype=torch.float16).fill_(1.0)
    print("\n| path | format | out | threads | median (min) ms | GB/s at the median |")
    print("|---|---|---|---|---|---|")
    for threads in sorted({1, all_threads}):
        torch.set_num_threads(threads)
        print(row("plain copy (clone)", "", "", threads, seconds(lambda: src.clone(), a.repeats), out_bytes), flush=True)
    for fmt, layer in layers(k, n, a.group).items():
        for dtype in (torch.float16,) if a.quick else (torch.float16, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            ref = kernel.reference(layer, dtype)
            for simd in (True, False):
                if not torch.equal(kernel.dequantize(layer, dtype, simd).view(torch.int16), ref.view(torch.int16)):
                    raise SystemExit(f"{fmt} {name} simd={simd}: the kernel's bits differ from the reference")
            del ref
            for threads in sorted({1, all_threads}):
                torch.set_num_threads(threads)
                paths = [("kernel AVX2", lambda: kernel.dequantize(layer, dtype)),
                         ("kernel, scalar lookups", lambda: kernel.dequantize(layer, dtype, simd=False))]
                if not a.quick:
                    paths.append(("torch reference", lambda: kernel.reference(layer, dtype)))
                for label, fn in paths:
                    times = seconds(fn, a.repeats if "reference" not in label else max(1, a.repeats // 2))
                    print(row(label, fmt, name, threads, times, out_bytes), flush=True)
        if a.quick:
            break


if __name__ == "__main__":
    main()

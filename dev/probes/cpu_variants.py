"""Build variants of kernels/cpu/dequant_w4_cpu.cpp (rows per block, k per tile, plain or streaming
stores) and time each on one layer, bit-checked against the reference first. A lab probe: the
variants are made by text substitution into a copy of the source, built under their own names.

Usage: PYTHONPATH=. python3 dev/probes/cpu_variants.py [--shape 4096x14336] [--repeats 9]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_cpu_dequant import layers  # noqa: E402

from w4cli.cpu import kernel  # noqa: E402

STORE_PLAIN = "#define W4_STORE(p, v) _mm256_storeu_si256(p, v)\n"
# streaming stores where the 32 bytes are aligned; the fence at the end of each block's rows
STORE_STREAM = ("#define W4_STORE(p, v) (((reinterpret_cast<uintptr_t>(p) & 31) == 0) ? "
                "_mm256_stream_si256(p, v) : _mm256_storeu_si256(p, v))\n")


def variant(rows: int, tile: int, stream: bool) -> str:
    text = kernel.SOURCE.read_text()
    old_store = ("      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_permute2x128_si256(a, b, 0x20));\n"
                 "      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k + 16), _mm256_permute2x128_si256(a, b, 0x31));")
    assert old_store in text
    text = text.replace(old_store, old_store.replace("_mm256_storeu_si256(", "W4_STORE("))
    text = text.replace("#include <torch/extension.h>", "#include <torch/extension.h>\n#include <immintrin.h>\n" + (STORE_STREAM if stream else STORE_PLAIN))
    text = text.replace("constexpr int64_t kRows = 64;", f"constexpr int64_t kRows = {rows};")
    text = text.replace("constexpr int64_t kTile = 512;", f"constexpr int64_t kTile = {tile};")
    if stream:
        text = text.replace("run_blocks(job, block, block + 1, use_simd);", "run_blocks(job, block, block + 1, use_simd), _mm_sfence();")
        assert "_mm_sfence" in text
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--variants", default="64x512,64x512s,16x2048,16x2048s,32x1024s,8x4096s")
    a = ap.parse_args()
    k, n = (int(x) for x in a.shape.split("x"))
    work = Path(tempfile.gettempdir()) / "w4-cpu-variants"
    work.mkdir(exist_ok=True)
    cases = layers(k, n, 128)
    refs = {name: kernel.reference(layer, torch.float16) for name, layer in cases.items()}
    torch.set_num_threads(1)
    print("| variant | " + " | ".join(f"{name} ms" for name in cases) + " |")
    print("|---|" + "---|" * len(cases))
    for spec in a.variants.split(","):
        stream = spec.endswith("s")
        rows, tile = (int(x) for x in spec.rstrip("s").split("x"))
        text = variant(rows, tile, stream)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        src = work / f"v_{digest}.cpp"
        src.write_text(text)
        (work / digest).mkdir(exist_ok=True)
        mod = cpp_extension.load(name=f"w4_cpu_variant_{digest}", sources=[str(src)], build_directory=str(work / digest), extra_cflags=["-O3"])
        times = []
        for name, layer in cases.items():
            args = (layer.words, layer.layout, n, k, layer.zeros, layer.scales, torch.empty(0, dtype=torch.int64), torch.float16, True)
            out = mod.dequantize_w4(*args)
            assert torch.equal(out.view(torch.int16), refs[name].view(torch.int16)), (spec, name)
            del out
            samples = []
            for _ in range(a.repeats):
                start = time.perf_counter()
                out = mod.dequantize_w4(*args)
                samples.append(time.perf_counter() - start)
                del out
            times.append(f"{statistics.median(samples) * 1e3:.1f} (min {min(samples) * 1e3:.1f})")
        print(f"| {spec} | " + " | ".join(times) + " |", flush=True)


if __name__ == "__main__":
    main()

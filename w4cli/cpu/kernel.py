"""The CPU dequantization kernel (kernels/cpu/dequant_w4_cpu.cpp): built on first use, loaded, called.

`w4 dequantize` on a CPU runs it; where it cannot be built (no C++ compiler, no Python headers, no
ninja) `dequantizer()` says so in one line and hands back the pure-torch reference, which gives
the same bits, slower. The build goes through torch.utils.cpp_extension.load, like the CUDA
kernels' (w4cli/gpu/kernels.py, whose build_or_load it shares: cache root, lock, log), into

    $XDG_CACHE_HOME/w4/kernels/cpu-<key>   (default ~/.cache/w4/kernels/cpu-<key>)

where <key> hashes the source, torch's and Python's versions, the machine and the compiler named
by $CXX, so a changed source or toolchain gets a fresh build, and later runs load it in about a
second. The kernel uses torch's intra-op threads: torch.set_num_threads limits it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from w4cli.errors import EnvironmentUnavailable
from w4cli.formats import reference as formats_reference
from w4cli.formats.packed import PackedLinear

SOURCE = Path(__file__).resolve().parent.parent.parent / "kernels" / "cpu" / "dequant_w4_cpu.cpp"
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_module: Any = None


def set_threads(requested: int | None) -> int:
    """torch's intra-op threads, which the kernel (and the reference) run on: `requested`, or every
    core this process may run on (its affinity mask, so taskset and container CPU sets count)."""
    if requested is None:
        requested = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(requested)
    return requested


def cache_key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, sys.version, platform.machine(), os.environ.get("CXX", "c++")):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:20]


def load() -> Any:
    """Build (first time, about 30 s) or load (cached) the module; EnvironmentUnavailable if impossible."""
    global _module
    if _module is None:
        from w4cli.gpu.kernels import build_or_load, require_ninja

        require_ninja()
        key = cache_key()
        _module = build_or_load(f"cpu-{key}", f"w4_cpu_{key}", "w4's CPU kernel",
                                "Building w4's CPU kernel (first run, about 30 s)", _jit_load)
    return _module


def _jit_load(name: str, build_dir: Path) -> Any:
    from torch.utils import cpp_extension

    # -O3 and no fast-math: the outputs are table lookups of exactly rounded values (the source says why)
    return cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=str(build_dir),
                              extra_cflags=["-O3"], verbose=False)


# layer: one PackedLinear -> [N, K] in dtype, bit-identical to formats/reference.py's dequantize
def dequantize(layer: PackedLinear, dtype: torch.dtype, simd: bool = True) -> torch.Tensor:
    """The kernel on one linear; simd False takes the portable scalar loop even where AVX2 exists
    (the tests compare both). Raises EnvironmentUnavailable where the kernel cannot be built."""
    if dtype not in OUT_DTYPES:
        raise ValueError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    n, k = layer.shape
    g_idx = layer.g_idx if layer.g_idx is not None else torch.empty(0, dtype=torch.int64)
    return load().dequantize_w4(layer.words.contiguous(), layer.layout, n, k, layer.zeros.contiguous(),
                                layer.scales.contiguous(), g_idx.contiguous(), dtype, simd)


def reference(layer: PackedLinear, dtype: torch.dtype) -> torch.Tensor:
    """The definition: the pure-torch dequantization every format shares."""
    return formats_reference.dequantize(layer, dtype)


def dequantizer(announce: Callable[[str], None]) -> Callable[[PackedLinear, torch.dtype], torch.Tensor]:
    """The kernel where it can be built here, else the reference, with one line to `announce` why."""
    try:
        load()
    except EnvironmentUnavailable as exc:
        announce(f"note: {exc}; dequantizing with the slower torch reference (the same bits)")
        return reference
    return dequantize

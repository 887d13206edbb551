"""Lazy JIT loader of the w4 CUDA kernels, and thin Python wrappers around them.

Nothing here builds or touches CUDA at import time: `w4` must import on machines without a GPU.
The first call that needs a kernel runs `load()`, which compiles `kernels/ops.cpp` plus every
`kernels/*.cu` with `torch.utils.cpp_extension.load` for the present GPU's architecture only (sm_90a
on compute capability 9.0, the target that has Hopper's warpgroup MMA), into

    $XDG_CACHE_HOME/w4/kernels/<key>   (default ~/.cache/w4/kernels/<key>)

where <key> hashes every kernel source (.cu/.cuh/.h/.cpp), the torch version, torch's CUDA version,
nvcc's version and the GPU arch, so a changed source or toolchain gets a fresh build directory and
later runs load the cached build in about a second.

Locking: torch guards a build directory with a `lock` file created O_EXCL and waits forever while it
exists, so a build killed halfway would hang every later run. We take our own `fcntl.flock` (released
by the kernel when the process dies, however it dies) around `load`, and while holding it delete any
torch `lock` left behind: nobody else can be building there, because every w4 build holds our lock.

Failure modes raise `EnvironmentUnavailable` (exit code 3) with one line: no CUDA GPU, a GPU older
than sm_80, no nvcc (`CUDA_HOME` unknown), no ninja, or a failed build (the compiler's log is written
to `<build dir>/build.log` and named in the message). `probe()` is the one question every command
asks before a GPU path: can this machine run w4's kernels, and if not, why not.

What the kernels take (shapes, groups, dtypes, rows per launch) is w4cli/gpu/contract.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from w4cli.gpu.contract import (
    BATCH_CHUNKED_MAX_M,
    BATCH_MAX_M,
    GEMV_MAX_M,
    GEMV_MEDIUM_LAYER,
    GEMV_TILE_M,
    OUT_DTYPES,
    TINY_LAYER,
    TINY_LAYER_DEQUANT_M,
    WGMMA_MAX_M,
    WGMMA_MIN_M,
    WGMMA_OVER_GEMV_M,
    WGMMA_SMALL_M_LAYER,
    WS_MAX_M,
    WS_MIN_M,
)
from w4cli.errors import EnvironmentUnavailable

KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"
SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".cpp")
LOCK_TIMEOUT_S = 30 * 60.0  # a first build takes about a minute; anything this long is a stuck peer

_module: Any = None


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/w4/kernels`, or `~/.cache/w4/kernels`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "w4" / "kernels"


def source_files(kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    """Every kernel source that goes into the hash (sorted, so the hash is stable)."""
    return sorted(p for p in kernel_dir.iterdir() if p.is_file() and p.suffix in SOURCE_SUFFIXES)


def build_sources(kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    """What is compiled: ops.cpp (the one binding) plus every .cu, so new kernels join by existing."""
    return [kernel_dir / "ops.cpp"] + sorted(kernel_dir.glob("*.cu"))


def _nvcc_path() -> str | None:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    if home:
        cand = Path(home) / "bin" / "nvcc"
        if cand.exists():
            return str(cand)
    return shutil.which("nvcc") if home else None


def _nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def cache_key(arch: str, kernel_dir: Path = KERNEL_DIR, nvcc_version: str = "") -> str:
    """Hash of the sources' names and contents, torch + CUDA versions, nvcc version and the arch."""
    h = hashlib.sha256()
    for p in source_files(kernel_dir):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    for part in (torch.__version__, str(torch.version.cuda), nvcc_version, arch, sys.version[:8]):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


def _gpu_arch() -> tuple[int, int]:
    if not torch.cuda.is_available():
        raise EnvironmentUnavailable("no CUDA GPU is visible to torch (torch.cuda.is_available() is False)")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        name = torch.cuda.get_device_name()
        raise EnvironmentUnavailable(f"the w4 kernels need compute capability 8.0 or newer; {name} is {major}.{minor}")
    return major, minor


def probe() -> tuple[bool, str]:
    """Can this machine run w4's kernels? (True, "") once they are loaded (built on first use, about a
    minute), else (False, why not, in one line). Never raises: each command decides whether to fall
    back to the CPU reference or stop."""
    try:
        load()
    except EnvironmentUnavailable as exc:
        return False, str(exc)
    except Exception as exc:  # noqa: BLE001 - a broken driver is a reason, not a crash
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


class _BuildLock:
    """Exclusive fcntl.flock on `path`, waiting at most `timeout` seconds.

    The kernel drops the lock when the holder's process dies, so a killed build never blocks the next.
    """

    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT_S, poll: float = 0.2):
        self.path, self.timeout, self.poll = path, timeout, poll
        self._fd: int | None = None

    def __enter__(self) -> "_BuildLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise EnvironmentUnavailable(
                        f"another w4 process has held the kernel build lock {self.path} for over "
                        f"{self.timeout:.0f}s; if none is running, delete that file"
                    ) from None
                time.sleep(self.poll)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def remove_stale_torch_lock(build_dir: Path) -> bool:
    """Delete torch's FileBaton `lock` in build_dir. Call only while holding _BuildLock.

    Returns True if a stale lock was found (a previous build was killed halfway).
    """
    stale = build_dir / "lock"
    try:
        stale.unlink()
        return True
    except FileNotFoundError:
        return False


def _extension_name(key: str) -> str:
    return f"w4_kernels_{key}"


def _is_built(build_dir: Path, name: str) -> bool:
    return any(build_dir.glob(f"{name}*.so"))


def require_ninja() -> None:
    """torch's JIT build runs `ninja` by name. The pip package (a dependency of w4) puts its binary
    in the venv's bin/, which is on PATH only in an activated venv: add it. EnvironmentUnavailable
    when there is no ninja at all."""
    from torch.utils import cpp_extension

    try:
        import ninja

        bin_dir = getattr(ninja, "BIN_DIR", None)
    except ImportError:
        bin_dir = None
    if bin_dir and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    if not cpp_extension.is_ninja_available():
        raise EnvironmentUnavailable("ninja not found (torch's JIT build needs it: pip install ninja)")


def build_or_load(key: str, name: str, label: str, building: str, jit_load: Callable[[str, Path], Any]) -> Any:
    """The extension `name` from its build directory cache_root()/key: jit_load(name, build_dir)
    loads it, building it first where it is not there (a Rich spinner on stderr says `building`),
    all under the build lock. A failed build raises EnvironmentUnavailable in one line naming
    `label` and the log it left (`<build dir>/build.log`)."""
    build_dir = cache_root() / key
    build_dir.mkdir(parents=True, exist_ok=True)
    with _BuildLock(cache_root() / f"{key}.lock"):
        remove_stale_torch_lock(build_dir)
        try:
            if _is_built(build_dir, name):
                return jit_load(name, build_dir)
            from w4cli.console import stderr as console

            with console.status(f"{building} in {build_dir}", spinner="dots"):
                return jit_load(name, build_dir)
        except Exception as exc:  # noqa: BLE001 - any build failure is an environment problem
            log = build_dir / "build.log"
            try:
                log.write_text(f"{type(exc).__name__}: {exc}\n")
            except OSError:
                log = Path("<unwritable>")
            raise EnvironmentUnavailable(f"building {label} failed; compiler log: {log}") from exc


def load() -> Any:
    """Build (first time) or load (cached) the kernels module; raise EnvironmentUnavailable if impossible."""
    global _module
    if _module is not None:
        return _module

    major, minor = _gpu_arch()
    nvcc = _nvcc_path()
    if nvcc is None:
        raise EnvironmentUnavailable("nvcc not found (torch.utils.cpp_extension.CUDA_HOME is not set); install the CUDA toolkit")
    require_ninja()

    arch = f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")  # sm_90a: wgmma
    key = cache_key(arch, nvcc_version=_nvcc_version(nvcc))
    os.environ.setdefault("MAX_JOBS", str(max(1, min(8, os.cpu_count() or 1))))

    cuda_flags = [
        "-O3",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",  # this GPU only; no --use_fast_math (bit-exactness)
        "-lineinfo",
    ]
    _module = build_or_load(key, _extension_name(key), "the w4 CUDA kernels",
                            f"Building w4 CUDA kernels for sm_{arch} (first run, about a minute)",
                            lambda name, build_dir: _jit_load(name, build_dir, cuda_flags))
    return _module


def _jit_load(name: str, build_dir: Path, cuda_flags: list[str]) -> Any:
    from torch.utils import cpp_extension

    return cpp_extension.load(
        name=name,
        sources=[str(p) for p in build_sources()],
        build_directory=str(build_dir),
        extra_cflags=["-O3"],
        extra_cuda_cflags=cuda_flags,
        extra_include_paths=[str(KERNEL_DIR)],
        verbose=False,
    )


# qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] fp16|bf16 (all CUDA, contiguous)
# -> [N, K] (transpose=True, nn.Linear layout) or [K, N]; bit-identical to
# w4cli.formats.awq_gemm.dequantize(qweight, qzeros, scales, dtype, transpose).
def dequantize_awq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    dtype: torch.dtype = torch.float16,
    transpose: bool = True,
) -> torch.Tensor:
    """Dequantize an AWQ "gemm" layer on the GPU.

    Args:
        qweight: [K, N/8] int32, 8 output channels per word in AWQ nibble order.
        qzeros: [K/G, N/8] int32, packed like qweight.
        scales: [K/G, N] float16 or bfloat16, 16-byte aligned.
        dtype: output dtype, float16, bfloat16 or float32.
        transpose: True -> [N, K] (nn.Linear.weight), False -> [K, N].
    Raises EnvironmentUnavailable when the kernels cannot be built here, and RuntimeError (from the
    binding's checks) for bad tensors.
    """
    if dtype not in [getattr(torch, name) for name in OUT_DTYPES]:
        raise ValueError(f"dtype must be one of {', '.join(OUT_DTYPES)}, got {dtype}")
    return load().dequantize_awq(qweight, qzeros, scales, dtype, bool(transpose))


# ---- the w4 GEMV layout: one linear layer, y = x @ W^T (+ bias), by batch size ----


def has_wgmma() -> bool:
    """Does this machine's GPU have the wgmma batch kernel (compute capability 9.0, built for
    sm_90a)? False without a CUDA GPU."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def gemv_path(m: int, k: int, n: int, wgmma: bool | None = None) -> str:
    """The kernel `gemv` runs for M rows of activations on a K x N layer, in words (what `w4 gemv`
    prints): "gemv" (the GEMV, one launch: M <= 8, and past that on latency-bound layers, where
    the batch kernels' staging costs more than it saves: M <= 16 on layers of at most
    GEMV_MEDIUM_LAYER weights, M < WGMMA_OVER_GEMV_M there where wgmma exists, M <= GEMV_MAX_M on
    layers of at most TINY_LAYER), "batch" (the mma.sync batch kernel, one read of the weight:
    M <= 64; where wgmma exists, M <= 16 on layers of at least WGMMA_SMALL_M_LAYER weights),
    "wgmma" (the barrier wgmma batch kernel, up to WS_MIN_M - 1 rows on compute capability 9.0),
    "wgmma ws" (the warp-specialised wgmma kernel, one launch per WS_MAX_M rows, from WS_MIN_M
    rows on compute capability 9.0), "batch xC" (C launches of at most 64 rows, each reading the
    weight), or "dequant+cuBLAS" (the fp16 weight rebuilt on the GPU, then torch's matmul; also from M = 64
    on layers of at most TINY_LAYER weights, which fill too few SMs). `wgmma`: whether the GPU has
    the wgmma kernels (None: this machine's, `has_wgmma`). The limits are contract.py's, measured
    on the H100 and H200 (docs/performance.md)."""
    if wgmma is None:
        wgmma = has_wgmma()
    medium_max_m = WGMMA_OVER_GEMV_M - 1 if wgmma else 2 * GEMV_TILE_M
    if m <= GEMV_TILE_M or (m <= medium_max_m and k * n <= GEMV_MEDIUM_LAYER) or (m <= GEMV_MAX_M and k * n <= TINY_LAYER):
        return "gemv"
    if m >= TINY_LAYER_DEQUANT_M and k * n <= TINY_LAYER:
        return "dequant+cuBLAS"
    if wgmma and m >= WS_MIN_M:
        return "wgmma ws"
    if wgmma and (m >= WGMMA_MIN_M or k * n < WGMMA_SMALL_M_LAYER):
        return "wgmma"
    if m <= BATCH_MAX_M:
        return "batch"
    if m <= BATCH_CHUNKED_MAX_M:
        return f"batch x{-(-m // BATCH_MAX_M)}"
    return "dequant+cuBLAS"


# x [M, K] fp16; qweight [N/8, ceil(K/128), 8, 16] int32; qzeros [K/G, N/8] int32;
# scales [K/G, N] fp16; bias [N] fp16 | None (all CUDA, contiguous) -> y [M, N] fp16
def gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    meta: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """y = x @ W^T (+ bias) for one linear in the w4-gemv layout (w4cli.formats.w4_gemv), any M.

    Args:
        x: [M, K] float16 activations (a 1-D [K] vector is taken as M = 1 and returns [N]).
        qweight, qzeros, scales: the layer's w4-gemv tensors (`w4_gemv.repack_from_awq`).
        meta: accepted so that `gemv(x, **layer)` works; not read (K comes from x, N and G from
            the tensor shapes), so no device-to-host copy happens here.
        bias: optional [N] float16, added in fp32 before the single rounding to fp16.
        pdl: launch the path's kernels (`gemv_path`: the GEMV or a batch kernel) with programmatic dependent
            launch: they start fetching weights while the previous kernel in the stream finishes (Hopper; the
            same bits).
    The kernel is chosen by M (`gemv_path`). Every path matches w4_gemv.gemv_reference(x, ...)
    within w4cli.gpu.checks' bound, and the two fused kernels give it bit for bit on exact data (the
    GEMV's scale-after-mma path with G % 128 == 0 and K >= 4096 skips the weight's fp16 rounding:
    kernels/gemv_w4a16.cu says why). Deterministic: the same inputs give the same bits on every run.
    Raises EnvironmentUnavailable when the kernels cannot be built here, RuntimeError (the
    binding's checks, one readable line) for bad tensors.
    """
    del meta
    if x.dim() == 1:
        return gemv(x.unsqueeze(0), qweight, qzeros, scales, bias=bias, pdl=pdl).squeeze(0)
    mod = load()
    path = gemv_path(x.shape[0], x.shape[1], scales.shape[-1]) if x.dim() == 2 else "gemv"  # the binding refuses other shapes
    if path == "gemv":
        return mod.gemv_w4(x, qweight, qzeros, scales, bias, 0, pdl)
    if path.startswith(("batch", "wgmma")):
        if scales.data_ptr() % 16:
            scales = scales.clone()  # the batch kernels copy scales 16 bytes at a time
        kernel, rows = {"wgmma ws": (3, WS_MAX_M), "wgmma": (2, WGMMA_MAX_M)}.get(path, (1, BATCH_MAX_M))
        if x.shape[0] <= rows:
            return mod.gemm_w4_batch(x, qweight, qzeros, scales, bias, 0, 0, kernel, pdl)
        return torch.cat([mod.gemm_w4_batch(x[i : i + rows].contiguous(), qweight, qzeros, scales, bias, 0, 0, kernel, pdl)
                          for i in range(0, x.shape[0], rows)], dim=0)
    weight = mod.dequantize_w4_gemv(qweight, qzeros, scales, x.shape[1])
    return torch.nn.functional.linear(x, weight, bias)


# qweight [N/8, ceil(K/128), 8, 16] int32; qzeros [K/G, N/8] int32; scales [K/G, N] fp16 -> [N, K] fp16
def dequantize_w4_gemv(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, k: int) -> torch.Tensor:
    """The layer's fp16 weight [N, K] (nn.Linear layout) on the GPU, bit-identical to
    w4_gemv.dequantize(..., torch.float16); K = in_features (qweight holds it rounded up to 128)."""
    return load().dequantize_w4_gemv(qweight, qzeros, scales, int(k))


def _gemv_splits(x: torch.Tensor, *, splits: int, **layer: torch.Tensor | None) -> torch.Tensor:
    """The GEMV kernel alone (M <= 32) with the warps per 16-row tile (split-K) fixed to `splits`
    (1..16; 0 = chosen from the occupancy, as `gemv` does). Not for users: the automatic choice
    depends on the GPU, so the tests fix it to cover every split's reduction, and dev/bench_gemv.py
    sweeps it."""
    return load().gemv_w4(x, layer["qweight"], layer["qzeros"], layer["scales"], layer.get("bias"), int(splits))


def _batch(x: torch.Tensor, *, splits: int = 0, tiles: int = 0, kernel: int = 1, order: int = 0,
           **layer: torch.Tensor | None) -> torch.Tensor:
    """One batch kernel alone (kernel 1 = mma.sync, M <= 64; 2 = wgmma, M <= 128; 3 = the
    warp-specialised wgmma, any M; 2 and 3 on compute capability 9.0) with its split-K count,
    tiling and k order fixed (0 = chosen as `gemv` does; for kernel 3, `tiles` is the variant 1..7
    of kernels/gemm_w4a16_wgmma.cu's pick_ws_variant: tokens per tile, m64 tiles per warpgroup and
    MMA warpgroups; `order` 1 stages x permuted by an x kernel, 2 as it lies, kernels 2 and 3
    only). Not for users: the tests fix them to cover every kernel, reduction and tile edge, and
    dev/bench_batch.py sweeps them."""
    return load().gemm_w4_batch(x, layer["qweight"], layer["qzeros"], layer["scales"], layer.get("bias"),
                                int(splits), int(tiles), int(kernel), False, int(order))

"""The GPU side of `w4 bench`: random inputs, reference checks, and timings through w4cli/timing.py.

For every shape: the dequantize kernel alone; then for every batch size M, four ways to compute
y = x @ W^T for one linear layer:
    fp16        torch.nn.functional.linear(x, W) on fp16 (cuBLAS)
    w4 GEMV     w4cli.kernels.gemv on w4_gemv.repack_from_awq tensors
    w4 dq+mm    w4cli.kernels.dequantize_awq(..., transpose=True) then F.linear (the large-M path)
    torch int4  torch._weight_int4pack_mm (tinygemm; bf16 activations, bf16 scale+zero pairs)
Each is checked on the inputs it is timed on (timing.measure's check, before and after timing); a
failed check is recorded as FAIL with no time. Method (timing.py): one CUDA graph per measurement
over rotating input sets totalling >= 4x L2 (each set has its own weights, so every call reads HBM),
warm-up replays, then the median of `replays` timed replays. Inputs are random, never zeros: full-
range int32 packed words, positive scales, normal activations.

Checks, and why each tolerance:
    dequantize  bit-exact against awq_gemm.dequantize on the full timed input: (q - z) * s is exact
                in fp32 and rounded once, so any differing bit is a bug.
    w4 GEMV     |out - ref| <= 2^-10 |ref| + 4 K 2^-24 (|x| @ |W|) + 2^-24, ref = w4_gemv.gemv_reference
                (fp32): one fp16 rounding of the output (2^-11 relative, doubled for margin), plus fp32
                summation in any order for the kernel and the reference (K u each, u = 2^-24, again
                doubled), plus the smallest fp16 subnormal for outputs that round to zero.
    cuBLAS-based (fp16, w4 dq+mm) and torch int4: normwise relative error against a float64 reference
                below 1e-2 (2e-2 for bf16 torch int4). These are baselines, not what w4 tests here;
                the check catches a wrong layout or transpose (error ~1), and cuBLAS may use reduced-
                precision split-K reductions that an elementwise fp32 bound would flag.
"""

from __future__ import annotations

import datetime
import math
import subprocess
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from w4cli import __version__, kernels, timing
from w4cli.bench import nbytes
from w4cli.bench.results import FAIL, SKIPPED, Report, Result
from w4cli.bench.shapes import ModelShapes, Shape
from w4cli.contract import gemv_refusal
from w4cli.checks import gemv_errors, require_identical, require_normwise
from w4cli.errors import CheckFailed, EnvironmentUnavailable
from w4cli.formats import awq_gemm, w4_gemv

DEV = "cuda"
L2_MULTIPLE = 4.0  # rotating working set over the L2 size (the harness's rule)
MAX_SETS = timing.MAX_SETS  # the harness's limit; tiny layers that still fit in L2 are flagged, not padded
MIN_SETS = 2

Step = Callable[[str], None]


# ---- random inputs (never zeros) ----


def _words(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return awq_gemm.random_words(shape, gen, DEV)


def _scales(groups: int, n: int, gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(groups, n, generator=gen, device=DEV) * 0.01 + 0.002).half()  # positive


def _nbytes(args: tuple) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


class _Layer:
    """Random weights of one K x N shape in every format, generated on demand and shared by batch sizes."""

    def __init__(self, k: int, n: int, group: int, seed: int):
        self.k, self.n, self.group, self.seed = k, n, group, seed
        self.groups = k // group if k % group == 0 else 0
        self._awq: list[tuple[torch.Tensor, ...]] = []
        self._gemv: list[tuple[torch.Tensor, ...]] = []
        self._fp16: list[torch.Tensor] = []
        self._int4: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.int4_codes0: torch.Tensor | None = None  # [N, K] codes of set 0, for the torch int4 check
        self.meta = torch.tensor([w4_gemv.LAYOUT_VERSION, k, n, group], dtype=torch.int32)

    def _gen(self, kind: int, i: int) -> torch.Generator:
        return torch.Generator(device=DEV).manual_seed(self.seed * 1_000_003 + kind * 10_007 + i)

    def awq(self, i: int) -> tuple[torch.Tensor, ...]:
        # qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] fp16
        while len(self._awq) <= i:
            g = self._gen(1, len(self._awq))
            self._awq.append((_words((self.k, self.n // 8), g), _words((self.groups, self.n // 8), g), _scales(self.groups, self.n, g)))
        return self._awq[i]

    def gemv(self, i: int) -> tuple[torch.Tensor, ...]:
        # qweight [N/8, Kp/128, 8, 16] int32; qzeros, scales as AWQ
        while len(self._gemv) <= i:
            t = w4_gemv.repack_from_awq(*self.awq(len(self._gemv)))
            self._gemv.append((t["qweight"], t["qzeros"], t["scales"]))
        return self._gemv[i]

    def fp16(self, i: int) -> torch.Tensor:
        # W [N, K] fp16
        while len(self._fp16) <= i:
            g = self._gen(2, len(self._fp16))
            self._fp16.append((torch.randn(self.n, self.k, generator=g, device=DEV) * 0.02).half())
        return self._fp16[i]

    def int4(self, i: int, inner_k_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        # tinygemm: packed [N/8, K/(16*tiles), 32, tiles/2] int32 (opaque); scale_and_zero [K/G, N, 2] bf16
        while len(self._int4) <= i:
            g = self._gen(3, len(self._int4))
            q = torch.randint(0, 16, (self.n, self.k), generator=g, device=DEV, dtype=torch.int32)
            packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)  # even k in the high nibble
            wpack = torch._convert_weight_to_int4pack(packed, inner_k_tiles)
            scale = torch.rand(self.groups, self.n, generator=g, device=DEV) * 0.01 + 0.002
            zero = (torch.rand(self.groups, self.n, generator=g, device=DEV) - 0.5) * 0.01
            sz = torch.stack([scale, zero], dim=-1).to(torch.bfloat16).contiguous()
            if not self._int4:
                self.int4_codes0 = q.to(torch.uint8)
            self._int4.append((wpack, sz))
        return self._int4[i]


def _activations(m: int, k: int, count: int, seed: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(m, k, generator=g, device=DEV).to(dtype) for _ in range(count)]


def _one_line(exc: BaseException, limit: int = 160) -> str:
    """An exception as one short line: type, then its first sentence."""
    text = " ".join(str(exc).split())
    cut = text.find(". ")
    text = text[: cut + 1] if 0 < cut < limit else text
    return f"{type(exc).__name__}: {text[:limit]}" + ("..." if len(text) > limit else "")


def sets_needed(per_set_bytes: int, l2_bytes: int) -> int:
    """Input sets whose total reaches 4x L2, between MIN_SETS and MAX_SETS."""
    return max(MIN_SETS, min(MAX_SETS, math.ceil(L2_MULTIPLE * l2_bytes / max(1, per_set_bytes))))


# ---- checks ----


def normwise(ref_fn: Callable[[tuple], torch.Tensor], limit: float) -> timing.CheckFn:
    def check(out: torch.Tensor, args: tuple) -> bool:
        require_normwise(out, ref_fn(args), limit)
        return True

    return check


def gemv_check(k: int, meta: torch.Tensor) -> timing.CheckFn:
    def check(out: torch.Tensor, args: tuple) -> bool:
        x, qweight, qzeros, scales = args
        gemv_errors(out, x, w4_gemv.dequantize(qweight, qzeros, scales, meta, torch.float16)).require()
        return True

    return check


def dequant_check(out: torch.Tensor, args: tuple) -> bool:
    require_identical(out, awq_gemm.dequantize(*args, dtype=torch.float16, transpose=True), "dequantize", "kernel", "reference")
    return True


# ---- the run ----


def int4_inner_k_tiles(k: int, n: int, group: int) -> tuple[int, str]:
    """(inner_k_tiles, "") if torch's int4 kernel takes this shape, else (0, why not)."""
    if not (hasattr(torch, "_weight_int4pack_mm") and hasattr(torch, "_convert_weight_to_int4pack")):
        return 0, f"torch {torch.__version__} has no _weight_int4pack_mm"
    if group not in (32, 64, 128, 256):
        return 0, f"torch int4 takes group sizes 32, 64, 128, 256, not {group}"
    if n % 8:
        return 0, "torch int4 needs N % 8 == 0"
    for tiles in (8, 4, 2):
        if k % (16 * tiles) == 0:
            return tiles, ""
    return 0, "torch int4 needs K % 32 == 0"


class Runner:
    def __init__(self, group: int, batches: list[int], replays: int = 30, step: Step | None = None):
        self.group, self.batches, self.replays = group, batches, replays
        self.step = step or (lambda label: None)
        self.results: list[Result] = []
        self.copy: timing.Timing | None = None
        self.l2 = 0

    # one measurement -> one Result (pass, FAIL or skipped), never an exception for a kernel's fault
    def _measure(self, shape: Shape, m: int | None, method: str, fn: Callable, sets: list[tuple],
                 check: timing.CheckFn, skip_errors: bool = False) -> Result:
        k, n = shape.k, shape.n
        label = f"{nbytes.LABELS[method]} {k}x{n}" + (f" M={m}" if m is not None else "")
        total = sum(_nbytes(a) for a in sets)
        multiple = min(L2_MULTIPLE, total / self.l2)
        note = "" if multiple >= L2_MULTIPLE else (
            f"working set {multiple:.1f}x L2 (wanted {L2_MULTIPLE:g}x)" if multiple >= 1.5
            else f"working set {multiple:.2f}x L2: partly served from L2, optimistic")
        try:
            t = timing.measure(fn, sets, nbytes.bytes_moved(method, k, n, m or 1, self.group), check, name=label,
                               copy=self.copy, replays=self.replays, l2_multiple=multiple * 0.999, min_sets=1)
            return Result.from_timing(k, n, m, method, t, note)
        except CheckFailed as exc:
            return Result(k, n, m, method, FAIL, str(exc))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return Result(k, n, m, method, SKIPPED, "out of GPU memory")
        except EnvironmentUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - a kernel refusing or crashing on this shape
            return Result(k, n, m, method, SKIPPED if skip_errors else FAIL, _one_line(exc))

    def _record(self, result: Result) -> None:
        self.results.append(result)

    def run_shape(self, shape: Shape, seed: int) -> None:
        k, n, group = shape.k, shape.n, self.group
        layer = _Layer(k, n, group, seed)
        why = gemv_refusal(k, n, group) if shape.quantized else "fp16 layer (not quantized by AWQ)"
        tiles, int4_why = int4_inner_k_tiles(k, n, group) if why is None else (0, why)
        w4_set = nbytes.w4_weight(k, n, group) if why is None else 0

        if why is None:
            self.step(f"{nbytes.LABELS[nbytes.W4_DEQUANT]} {shape.label}")
            count = sets_needed(w4_set, self.l2)
            sets = [layer.awq(i) for i in range(count)]
            self._record(self._measure(shape, None, nbytes.W4_DEQUANT,
                                       lambda qw, qz, s: kernels.dequantize_awq(qw, qz, s, torch.float16, True),
                                       sets, dequant_check))
        elif shape.quantized:
            self._record(Result(k, n, None, nbytes.W4_DEQUANT, SKIPPED, why))

        for m in self.batches:
            act = m * k * 2
            # fp16 cuBLAS
            self.step(f"{nbytes.LABELS[nbytes.FP16]} {shape.label} M={m}")
            count = sets_needed(nbytes.fp16_weight(k, n) + act, self.l2)
            xs = _activations(m, k, count, seed * 7 + m, torch.float16)
            sets = [(xs[i], layer.fp16(i)) for i in range(count)]
            self._record(self._measure(shape, m, nbytes.FP16, lambda x, w: F.linear(x, w), sets,
                                       normwise(lambda a: a[0].double() @ a[1].double().t(), 1e-2)))
            if why is not None:
                if shape.quantized:
                    for method in (nbytes.W4_GEMV, nbytes.W4_DQ_MM, nbytes.TORCH_INT4):
                        self._record(Result(k, n, m, method, SKIPPED, why))
                continue

            count = sets_needed(w4_set + act, self.l2)
            xs = _activations(m, k, count, seed * 11 + m, torch.float16)
            # w4 GEMV
            self.step(f"{nbytes.LABELS[nbytes.W4_GEMV]} {shape.label} M={m}")
            sets = [(xs[i], *layer.gemv(i)) for i in range(count)]
            self._record(self._measure(shape, m, nbytes.W4_GEMV, lambda x, qw, qz, s: kernels.gemv(x, qw, qz, s),
                                       sets, gemv_check(k, layer.meta)))
            # w4 dequantize, then fp16 matmul
            self.step(f"{nbytes.LABELS[nbytes.W4_DQ_MM]} {shape.label} M={m}")
            sets = [(xs[i], *layer.awq(i)) for i in range(count)]

            def dq_mm(x: torch.Tensor, qw: torch.Tensor, qz: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
                return F.linear(x, kernels.dequantize_awq(qw, qz, s, torch.float16, True))

            def dq_ref(a: tuple) -> torch.Tensor:
                return a[0].double() @ awq_gemm.dequantize(*a[1:], dtype=torch.float16, transpose=True).double().t()

            self._record(self._measure(shape, m, nbytes.W4_DQ_MM, dq_mm, sets, normwise(dq_ref, 1e-2)))
            # torch's int4 kernel (tinygemm)
            self._record(self._torch_int4(shape, m, layer, tiles, int4_why, seed))
        del layer
        torch.cuda.empty_cache()

    def _torch_int4(self, shape: Shape, m: int, layer: _Layer, tiles: int, why: str, seed: int) -> Result:
        k, n, group = shape.k, shape.n, self.group
        self.step(f"{nbytes.LABELS[nbytes.TORCH_INT4]} {shape.label} M={m}")
        if not tiles:
            return Result(k, n, m, nbytes.TORCH_INT4, SKIPPED, why)
        count = sets_needed(nbytes.torch_int4_weight(k, n, group) + m * k * 2, self.l2)
        try:
            weights = [layer.int4(i, tiles) for i in range(count)]
        except Exception as exc:  # noqa: BLE001 - this torch's int4 packing refused the shape
            return Result(k, n, m, nbytes.TORCH_INT4, SKIPPED, f"_convert_weight_to_int4pack: {_one_line(exc)}")
        xs = _activations(m, k, count, seed * 13 + m, torch.bfloat16)
        sets = [(xs[i], *weights[i]) for i in range(count)]
        wpack0 = weights[0][0]

        def ref(a: tuple) -> torch.Tensor:
            # tinygemm's convention: w = (q - 8) * scale + zero, per group along K
            if a[1] is not wpack0:
                raise AssertionError("checked on an unexpected input set")
            sz = a[2]
            s = sz[..., 0].double().repeat_interleave(group, 0).t()  # [N, K]
            z = sz[..., 1].double().repeat_interleave(group, 0).t()
            w = (layer.int4_codes0.double() - 8) * s + z  # type: ignore[union-attr]
            return a[0].double() @ w.t()

        return self._measure(shape, m, nbytes.TORCH_INT4, lambda x, w, sz: torch._weight_int4pack_mm(x, w, group, sz),
                             sets, normwise(ref, 2e-2), skip_errors=True)


def environment() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    env: dict[str, Any] = {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(props.L2_cache_size),
        "memory_bytes": int(props.total_memory),
        "compute_capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "w4": __version__,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
    }
    try:  # the driver version is not in torch's device properties; nvidia-smi is optional
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i",
                              str(torch.cuda.current_device())], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            env["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return env


def run(shapes: list[Shape], batches: list[int], group: int, *, model: ModelShapes | None = None,
        replays: int = 30, step: Step | None = None) -> Report:
    """Measure every shape at every batch size; needs a CUDA GPU and the w4 kernels (kernels.load())."""
    kernels.load()
    runner = Runner(group, batches, replays, step)
    runner.l2 = timing.l2_cache_bytes()
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 references must be fp32
    try:
        if step:
            step("copy bandwidth")
        runner.copy = timing.copy_bandwidth(replays=replays)
        env = environment()
        for i, shape in enumerate(shapes):
            runner.run_shape(shape, seed=i + 1)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    env["copy_gbps"] = runner.copy.gbps
    env["copy_method"] = runner.copy.name
    env["replays"] = replays
    env["method"] = (f"each measurement: one CUDA graph over rotating input sets >= {L2_MULTIPLE:g}x L2, "
                     f"3 warm-up replays, median of {replays} timed replays (w4cli/timing.py)")
    return Report(env, runner.copy.gbps, runner.copy.name, group, batches, shapes, runner.results, model)


def steps_for(shapes: list[Shape], batches: list[int], group: int) -> int:
    """How many step() calls run() makes (for a progress bar)."""
    total = 1
    for s in shapes:
        ok = s.quantized and gemv_refusal(s.k, s.n, group) is None
        total += len(batches) * (4 if ok else 1) + (1 if ok else 0)
    return total

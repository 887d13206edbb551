"""What `w4 bench`, `w4 gemv --time` and the scripts in dev/ measure, one object per method.

A Method is one way to compute y = x @ W^T for a linear layer (or, for the dequantize kernel, W
itself): how to make its inputs, how to run it, how to check its output against the reference, and
how many bytes one call is credited with. `method.case(layer, m)` binds it to one layer and batch
size M; `case.measure()` is w4cli/gpu/timing.py's check-then-time. Adding a method (a batch kernel, a peer
to compare with) is adding one Method to METHODS: the runner, the tables and the JSON follow.

    fp16 cuBLAS     torch.nn.functional.linear(x, W) on fp16
    w4 GEMV         w4cli.gpu.kernels.gemv on w4_gemv.repack_from_awq tensors
    w4 dequant+mm   w4cli.gpu.kernels.dequantize_awq(..., transpose=True) then F.linear (the large-M path)
    torch int4      torch._weight_int4pack_mm (tinygemm; bf16 activations, bf16 scale+zero pairs)
    w4 dequantize   the dequantize kernel alone, once per shape

Checks (w4cli/gpu/checks.py), and why each tolerance:
    w4 dequantize  bit-exact against awq_gemm.dequantize: (q - z) * s is exact in fp32 and rounded
                   once, so any differing bit is a bug.
    w4 GEMV        the GEMV bound of w4cli/gpu/checks.py, whose docstring derives it.
    fp16 cuBLAS, w4 dequant+mm, torch int4: normwise relative error against a float64 reference
                   below 1e-2 (2e-2 for bf16 torch int4). These are baselines, not what w4 tests
                   here; the check catches a wrong layout or transpose (error ~1), and cuBLAS may use
                   reduced-precision split-K reductions that an elementwise fp32 bound would flag.

Bytes credited to one call (the numerator of every GB/s; docs/bench.md repeats it):

    K = in_features, N = out_features, M = batch rows, G = group size; 1 GB = 1e9 bytes
    activations + output   M*K*2 + M*N*2                 (fp16 or bf16 x read, y written)
    fp16 cuBLAS            K*N*2             + act/out   (the fp16 weight)
    w4 (GEMV, and dequantize + matmul)
                           K*N/2 + (K/G)*N*2 + (K/G)*N/2 + act/out
                           (int4 codes, fp16 scales, int4 zeros packed 8 per int32)
    torch int4             K*N/2 + (K/G)*N*2*2 + act/out (tinygemm: bf16 scale and zero per group)
    dequantize alone       K*N/2 + (K/G)*N*2 + (K/G)*N/2 + K*N*2   (reads int4, writes fp16 [N, K])

These are the bytes a layer's *format* needs, not what an implementation happens to move: the
dequantize + matmul path also writes and re-reads a 2*K*N fp16 weight, which is exactly why its
effective GB/s is low. So GB/s compares formats and kernels on one scale, and % of copy says how close
a kernel comes to the fastest it could be on this GPU (the copy ceiling counts read + write bytes).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from w4cli.gpu import checks, contract, kernels, timing
from w4cli.formats import awq_gemm, w4_gemv

FP16 = "fp16"
W4_GEMV = "w4_gemv"
W4_DQ_MM = "w4_dequant_mm"
TORCH_INT4 = "torch_int4"
W4_DEQUANT = "w4_dequant"


# ---- input sets ----


class Layer:
    """The input sets of one K x N linear: random weight set i in each format a method takes, made on
    first use and kept, so every batch size and method of a shape shares them, and random activations
    per (M, i). Random, never zeros: full-range packed words, positive scales, normal activations."""

    bias: torch.Tensor | None = None

    def __init__(self, k: int, n: int, group: int, seed: int, device: str = "cuda"):
        self.k, self.n, self.group, self.seed, self.device = k, n, group, seed, device
        self.meta = torch.tensor([w4_gemv.LAYOUT_VERSION, k, n, group], dtype=torch.int32)
        self._sets: dict[str, list[Any]] = {}

    def generator(self, kind: str, i: int) -> torch.Generator:
        # one stream per (layer, kind, set): a new kind never changes another's data
        return torch.Generator(device=self.device).manual_seed(zlib.crc32(f"{self.seed}:{kind}:{i}".encode()))

    def cached(self, kind: str, i: int, make: Callable[[int], Any]) -> Any:
        """Set i of one kind: make(i) on first use, then kept."""
        sets = self._sets.setdefault(kind, [])
        while len(sets) <= i:
            sets.append(make(len(sets)))
        return sets[i]

    # -> x [M, K], made afresh on each call (activations are small next to weights)
    def x(self, m: int, i: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
        return torch.randn(m, self.k, generator=self.generator(f"x{m}", i), device=self.device).to(dtype)

    # -> qweight [K, N/8] int32; qzeros [K/G, N/8] int32; scales [K/G, N] fp16
    def awq(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cached("awq", i, lambda j: awq_gemm.random_layer(self.k, self.n, self.group, self.generator("awq", j)))

    # -> qweight [N/8, Kp/128, 8, 16] int32; qzeros, scales as AWQ
    def gemv(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def repack(j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            t = w4_gemv.repack_from_awq(*self.awq(j))
            return t["qweight"], t["qzeros"], t["scales"]

        return self.cached("gemv", i, repack)


class CheckpointLayer(Layer):
    """One linear as a checkpoint holds it (w4-gemv tensors, bias), for the GEMV: weight set i is a
    copy of its tensors, so the rotation still reads HBM on every call."""

    def __init__(self, tensors: dict[str, torch.Tensor], bias: torch.Tensor | None, seed: int, device: str = "cuda"):
        _, k, n, g = (int(v) for v in tensors["meta"].tolist())
        super().__init__(k, n, g, seed, device)
        self._tensors = tuple(tensors[s].to(device) for s in ("qweight", "qzeros", "scales"))
        self.bias = None if bias is None else bias.to(device)

    def gemv(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cached("gemv", i, lambda j: tuple(t.clone() for t in self._tensors))


# ---- methods and cases ----


@dataclass(frozen=True)
class Case:
    """One method on one layer at one batch size: what w4cli.gpu.timing.measure takes."""

    name: str
    inputs: Callable[[int], tuple]  # input set i; the harness makes as many as cover 4x L2
    run: Callable[..., torch.Tensor]
    check: Callable[[torch.Tensor, tuple], None]  # raises checks.Mismatch
    bytes_moved: int

    def measure(self, copy: timing.Timing | None = None, **options: Any) -> timing.Timing:
        """Check, then time (timing.measure's options pass through); CheckFailed instead of a wrong time."""
        return timing.measure(self.run, self.inputs, self.bytes_moved, self.check, name=self.name, copy=copy, **options)


@dataclass(frozen=True)
class Method:
    """One way to compute a linear layer's output (or its weight): all a measurement of it needs."""

    key: str  # the name in JSON
    label: str  # the name in tables
    bytes_text: str  # the byte count in words (JSON's bytes_definition)
    bytes_for: Callable[[int, int, int, int], int]  # (K, N, M, G) -> bytes one call is credited with
    inputs: Callable[[Layer, int, int], tuple]  # (layer, M, i) -> input set i
    run: Callable[..., torch.Tensor]  # (layer, *input set) -> output
    check: Callable[[Layer, torch.Tensor, tuple], None]  # (layer, output, input set); raises Mismatch
    refusal: Callable[[int, int, int], str | None] = lambda k, n, g: None  # why it cannot take K x N at G
    batched: bool = True  # False: no activations, measured once per shape (M is None)
    quantized: bool = True  # False: runs on the fp16 layers (lm_head) too
    optional: bool = False  # a method this torch may lack: an error is a skip with the reason, not FAIL

    def bytes_moved(self, k: int, n: int, m: int | None, group: int) -> int:
        return self.bytes_for(k, n, m or 1, group)

    def case(self, layer: Layer, m: int | None) -> Case:
        name = f"{self.label} {layer.k}x{layer.n}" + (f" M={m}" if m is not None else "")
        return Case(name, partial(self.inputs, layer, m), partial(self.run, layer), partial(self.check, layer),
                    self.bytes_moved(layer.k, layer.n, m, layer.group))


def _act(k: int, n: int, m: int) -> int:
    return m * k * 2 + m * n * 2


def _w4(k: int, n: int, group: int) -> int:
    groups = k // group
    return k * n // 2 + groups * n * 2 + groups * n // 2


# -> W [N, K] fp16
def _fp16_weight(layer: Layer, i: int) -> torch.Tensor:
    gen = layer.generator("fp16", i)
    return (torch.randn(layer.n, layer.k, generator=gen, device=layer.device) * 0.02).half()


FP16_CUBLAS = Method(
    FP16, "fp16 cuBLAS", "K*N*2 + M*K*2 + M*N*2",
    lambda k, n, m, g: k * n * 2 + _act(k, n, m),
    inputs=lambda layer, m, i: (layer.x(m, i), layer.cached("fp16", i, partial(_fp16_weight, layer))),
    run=lambda layer, x, w: F.linear(x, w),
    check=lambda layer, out, args: checks.require_normwise(out, args[0].double() @ args[1].double().t(), 1e-2),
    quantized=False,
)


# the kernel's output of one input set (x, qweight, qzeros, scales, bias) against its float64 reference
def w4_gemv_errors(layer: Layer, out: torch.Tensor, args: tuple) -> checks.GemvErrors:
    x, qweight, qzeros, scales, bias = args
    return checks.gemv_errors(out, x, w4_gemv.dequantize(qweight, qzeros, scales, layer.meta, torch.float16), bias)


W4_GEMV_KERNEL = Method(
    W4_GEMV, "w4 GEMV", "K*N/2 + (K/G)*N*2 + (K/G)*N/2 + M*K*2 + M*N*2",
    lambda k, n, m, g: _w4(k, n, g) + _act(k, n, m),
    inputs=lambda layer, m, i: (layer.x(m, i), *layer.gemv(i), layer.bias),
    run=lambda layer, x, qweight, qzeros, scales, bias: kernels.gemv(x, qweight, qzeros, scales, bias=bias),
    check=lambda layer, out, args: w4_gemv_errors(layer, out, args).require(),
    refusal=contract.gemv_refusal,
)


def _dequant_mm_ref(args: tuple) -> torch.Tensor:
    x, *awq = args
    return x.double() @ awq_gemm.dequantize(*awq, dtype=torch.float16, transpose=True).double().t()


W4_DEQUANT_MM = Method(
    W4_DQ_MM, "w4 dequant+mm", "K*N/2 + (K/G)*N*2 + (K/G)*N/2 + M*K*2 + M*N*2 (the format's bytes, not the fp16 round trip)",
    lambda k, n, m, g: _w4(k, n, g) + _act(k, n, m),
    inputs=lambda layer, m, i: (layer.x(m, i), *layer.awq(i)),
    run=lambda layer, x, qweight, qzeros, scales: F.linear(x, kernels.dequantize_awq(qweight, qzeros, scales, torch.float16, True)),
    check=lambda layer, out, args: checks.require_normwise(out, _dequant_mm_ref(args), 1e-2),
    refusal=contract.dequantize_refusal,
)


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


# -> tinygemm's packed [N/8, K/(16*tiles), 32, tiles/2] int32 (opaque), scale_and_zero [K/G, N, 2]
# bf16, and for set 0 the codes [N, K] uint8 the check rebuilds the weight from
def _int4_weights(layer: Layer, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen, groups = layer.generator("int4", i), layer.k // layer.group
    q = torch.randint(0, 16, (layer.n, layer.k), generator=gen, device=layer.device, dtype=torch.int32)
    packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)  # even k in the high nibble
    scale = torch.rand(groups, layer.n, generator=gen, device=layer.device) * 0.01 + 0.002
    zero = (torch.rand(groups, layer.n, generator=gen, device=layer.device) - 0.5) * 0.01
    tiles = int4_inner_k_tiles(layer.k, layer.n, layer.group)[0]
    return (torch._convert_weight_to_int4pack(packed, tiles), torch.stack([scale, zero], dim=-1).to(torch.bfloat16).contiguous(),
            q.to(torch.uint8) if i == 0 else None)


def _int4_check(layer: Layer, out: torch.Tensor, args: tuple) -> None:
    x, wpack, sz = args
    wpack0, _, codes = layer.cached("int4", 0, partial(_int4_weights, layer))
    if wpack is not wpack0:
        raise checks.Mismatch("checked on an unexpected input set")
    # tinygemm's convention: w = (q - 8) * scale + zero, per group along K
    s = sz[..., 0].double().repeat_interleave(layer.group, 0).t()  # [N, K]
    z = sz[..., 1].double().repeat_interleave(layer.group, 0).t()
    checks.require_normwise(out, x.double() @ ((codes.double() - 8) * s + z).t(), 2e-2)


TORCH_INT4_KERNEL = Method(
    TORCH_INT4, "torch int4", "K*N/2 + (K/G)*N*2*2 + M*K*2 + M*N*2 (bf16 scale and zero per group)",
    lambda k, n, m, g: k * n // 2 + (k // g) * n * 4 + _act(k, n, m),
    inputs=lambda layer, m, i: (layer.x(m, i, torch.bfloat16), *layer.cached("int4", i, partial(_int4_weights, layer))[:2]),
    run=lambda layer, x, wpack, sz: torch._weight_int4pack_mm(x, wpack, layer.group, sz),
    check=_int4_check,
    refusal=lambda k, n, g: contract.dequantize_refusal(k, n, g) or int4_inner_k_tiles(k, n, g)[1] or None,
    optional=True,
)


def dequantize_method(dtype: torch.dtype = torch.float16, transpose: bool = True) -> Method:
    """The dequantize kernel alone, writing dtype as [N, K] (transpose) or [K, N]: `w4 bench` times
    float16 [N, K], dev/bench_dequant.py every output."""
    short = contract.OUT_DTYPES[str(dtype).removeprefix("torch.")]
    size = dtype.itemsize
    default = dtype == torch.float16 and transpose
    return Method(
        W4_DEQUANT if default else f"{W4_DEQUANT}_{short}_{'nk' if transpose else 'kn'}",
        "w4 dequantize" if default else f"w4 dequantize {short} {'[N,K]' if transpose else '[K,N]'}",
        f"K*N/2 + (K/G)*N*2 + (K/G)*N/2 + K*N*{size} (read int4, scales, zeros; write {short})",
        lambda k, n, m, g: _w4(k, n, g) + k * n * size,
        inputs=lambda layer, m, i: layer.awq(i),
        run=lambda layer, qweight, qzeros, scales: kernels.dequantize_awq(qweight, qzeros, scales, dtype, transpose),
        check=lambda layer, out, args: checks.require_identical(
            out, awq_gemm.dequantize(*args, dtype=dtype, transpose=transpose), "dequantize", "kernel", "reference"),
        refusal=contract.dequantize_refusal,
        batched=False,
    )


# per (shape, M) in table order, then the dequantize kernel alone, per shape
METHODS = {m.key: m for m in (FP16_CUBLAS, W4_GEMV_KERNEL, W4_DEQUANT_MM, TORCH_INT4_KERNEL, dequantize_method())}
LAYER_METHODS = tuple(key for key, m in METHODS.items() if m.batched)

DEFINITION = {
    "unit": "1 GB = 1e9 bytes; GB/s = bytes_moved / median time",
    "activations_output": "M*K*2 + M*N*2",
    **{m.key: m.bytes_text for m in METHODS.values()},
    "copy": "2 * buffer bytes (read + write) of a device-to-device copy, the faster of memcpy and an SM kernel",
}


def label(key: str) -> str:
    """The table name of a method (the key itself for one not in METHODS)."""
    return METHODS[key].label if key in METHODS else key


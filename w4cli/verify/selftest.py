"""`w4 verify` with no target: the kernels and their references over a fixed matrix of shapes.

Per shape (K = in_features, N = out_features, G = group size), with words drawn from the FULL
32-bit range (sign bit included: `>>` on int32 is arithmetic, and upstream tests that draw from
[0, 2^31) never set the top nibble >= 8):

    ref dequantize   awq_gemm.dequantize (the CPU path of `w4 dequantize`, the oracle) vs an
                     independent restatement, fp16/bf16/fp32 x [N,K]/[K,N], raw bits
    ref repack       w4_gemv.to_awq(repack_from_awq(x)) == x word for word; w4-gemv unpack and
                     dequantize == AWQ unpack and dequantize, raw bits
    ref gemv         w4_gemv.gemv_reference rounded to fp16 == a float64 restatement, exact data
    gpu dequantize   kernels.dequantize_awq vs the CPU reference, every dtype and output layout,
                     from AWQ tensors and from w4-gemv tensors (to_awq on the GPU), raw bits
    gpu repack       repack_from_awq / to_awq on the GPU == on the CPU, word for word
    gpu gemv exact   kernels.gemv, M = 1..8, x in {-1, 0, 1}, scales +-2^-6..2^-3, bias on a 2^-6
                     grid: every fp32 sum is exact, so out == fp32 reference rounded once, bit for bit
    gpu gemv random  kernels.gemv, M = 1..8, normal x, real-checkpoint scales: inside the bound of
                     bits.gemv_error against a float64 reference; two runs bit-identical

Shapes the GEMV kernel cannot take (K % 8, G neither a multiple of 32 nor K) get the dequantize
rows only. Everything is seeded from --seed, so two runs print the same report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from w4cli.formats import awq_gemm, w4_gemv
from w4cli.verify.bits import gemv_error, raw_bits, require_identical
from w4cli.verify.environment import Gpu
from w4cli.console import steps
from w4cli.verify.report import Mismatch, Report, run_check, skip

GROUP = "selftest"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
M_MAX = 8  # GEMV rows checked: 1..8, every width of the kernel's n8 activation tile
# scale values that hit fp16's edges: overflow to inf, subnormal products, exact powers of two
EXTREME_SCALES = (65504.0, -6.0e-8, 6.1e-5, -3.0e-6, 4500.0, -1.0e-4, 1.0, -2.5e3)


@dataclass(frozen=True)
class Shape:
    k: int
    n: int
    g: int
    why: str
    quick: bool = False
    scale_dtype: torch.dtype = torch.float16

    @property
    def label(self) -> str:
        extra = " bf16-scales" if self.scale_dtype == torch.bfloat16 else ""
        return f"{self.k}x{self.n} g{self.g}{extra}"

    @property
    def gemv_legal(self) -> bool:
        return self.k % 8 == 0 and self.n % 8 == 0 and (self.g % 32 == 0 or self.g == self.k) and self.scale_dtype == torch.float16


# data, not code: real layers, the smallest legal shape, odd sizes, tile edges, every group size
SHAPES = [
    Shape(4096, 4096, 128, "Llama q_proj / o_proj"),
    Shape(4096, 14336, 128, "Llama-3 8B gate_proj / up_proj"),
    Shape(14336, 4096, 128, "Llama-3 8B down_proj"),
    Shape(1024, 1024, 32, "group 32"),
    Shape(1024, 1024, 64, "group 64"),
    Shape(384, 1024, 384, "one group (G = K)"),
    Shape(32, 8, 32, "smallest legal shape", quick=True),
    Shape(160, 136, 32, "N/8 = 17, K % 128 != 0: tails in both dimensions", quick=True),
    Shape(200, 56, 200, "one odd group, K % 128 != 0", quick=True),
    Shape(4128, 1032, 32, "K = 4096 + 32, N % 16 == 8: half-empty last tile"),
    Shape(4104, 8, 4104, "one group, K % 128 == 8"),
    Shape(384, 264, 64, "bf16 scales (dequantize only)", quick=True, scale_dtype=torch.bfloat16),
    Shape(120, 64, 40, "G = 40: dequantize only (GEMV needs G % 32 == 0)", quick=True),
    Shape(36, 16, 12, "K % 8 != 0: dequantize only"),
]


def shapes(quick: bool) -> list[Shape]:
    return [s for s in SHAPES if s.quick or not quick]


# ---- data ------------------------------------------------------------------------------------


def _generator(seed: int, shape: Shape, salt: int) -> torch.Generator:
    # one stream per (seed, shape, purpose): adding a shape never changes another shape's data
    key = (seed * 1_000_003 + shape.k * 7_919 + shape.n * 104_729 + shape.g * 31 + salt) % (2**63)
    return torch.Generator().manual_seed(key)


# -> qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N] (random, never 0, 8 extremes)
def dequant_layer(shape: Shape, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = _generator(seed, shape, 1)
    groups = shape.k // shape.g
    qweight = awq_gemm.random_words((shape.k, shape.n // 8), gen)
    qzeros = awq_gemm.random_words((groups, shape.n // 8), gen)
    scales = (torch.randn(groups, shape.n, generator=gen) * 0.02).to(shape.scale_dtype)
    scales[scales == 0] = 0.01
    flat = scales.view(-1)
    extremes = torch.tensor(EXTREME_SCALES[: flat.numel()]).to(shape.scale_dtype)
    flat[: extremes.numel()] = extremes
    return qweight, qzeros, scales


# -> the w4-gemv tensors of a random layer; exact: scales +-2^-6..2^-3, else 2^-9..2^-4 (real AWQ)
def gemv_layer(shape: Shape, seed: int, exact: bool) -> dict[str, torch.Tensor]:
    gen = _generator(seed, shape, 2 if exact else 3)
    groups = shape.k // shape.g
    qweight = awq_gemm.random_words((shape.k, shape.n // 8), gen)
    qzeros = awq_gemm.random_words((groups, shape.n // 8), gen)
    sign = torch.randint(0, 2, (groups, shape.n), generator=gen) * 2 - 1
    if exact:
        expo = torch.randint(-6, -2, (groups, shape.n), generator=gen).float()
    else:
        expo = torch.rand(groups, shape.n, generator=gen) * 5 - 9
    scales = (sign * torch.exp2(expo)).half()
    return w4_gemv.repack_from_awq(qweight, qzeros, scales)


# -> x [M_MAX, K] fp16 and bias [N] fp16; exact: x in {-1, 0, 1}, bias on a 2^-6 grid
def activations(shape: Shape, seed: int, exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = _generator(seed, shape, 4 if exact else 5)
    if exact:
        x = torch.randint(-1, 2, (M_MAX, shape.k), generator=gen).half()
        bias = (torch.randint(-64, 64, (shape.n,), generator=gen) * 2.0**-6).half()
    else:
        x = torch.randn(M_MAX, shape.k, generator=gen).half()
        bias = torch.randn(shape.n, generator=gen).half()
    return x, bias


# ---- independent restatements ----------------------------------------------------------------


# packed [R, C/8] int32 -> [R, C] int32 codes: arithmetic shifts of the signed word, then a mask,
# gathered back by the documented nibble table (docs/formats.md), not by w4cli's own unpack
def restated_unpack(packed: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # [R, C/8, 8], nibble i at index i
    reverse = torch.tensor(awq_gemm.AWQ_REVERSE_ORDER)  # channel j sits in nibble reverse[j]
    return nibbles[:, :, reverse].reshape(packed.shape[0], -1)


def restated_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, transpose: bool) -> torch.Tensor:
    """(q - z) * s as integers times float64 scales, rounded once from float64 (the product has at
    most 15 significant bits, so the float64 value is exact and the one cast is the only rounding)."""
    g = qweight.shape[0] // scales.shape[0]
    diff = restated_unpack(qweight) - restated_unpack(qzeros).repeat_interleave(g, dim=0)
    exact = diff.to(torch.float64) * scales.to(torch.float64).repeat_interleave(g, dim=0)  # [K, N]
    return (exact.t() if transpose else exact).to(dtype).contiguous()


# ---- checks ----------------------------------------------------------------------------------


LAYOUTS = {"[N,K]": True, "[K,N]": False}


def _ref_dequantize(qw, qz, s, refs: dict[tuple[str, str], torch.Tensor]) -> Callable[[], str]:
    def body() -> str:
        for dname, dtype in DTYPES.items():
            for lname, transpose in LAYOUTS.items():
                ref = awq_gemm.dequantize(qw, qz, s, dtype=dtype, transpose=transpose)
                require_identical(ref, restated_dequantize(qw, qz, s, dtype, transpose), f"{dname} {lname}", "reference", "restatement")
                refs[(dname, lname)] = ref
        return f"{len(refs)} outputs bit-identical ({qw.numel() * 8:,} weights each)"

    return body


def _ref_repack(qw, qz, s) -> Callable[[], str]:
    def body() -> str:
        layer = w4_gemv.repack_from_awq(qw, qz, s)
        back = w4_gemv.to_awq(**layer)
        require_identical(back["qweight"], qw, "to_awq(repack(qweight))", "round trip", "original")
        require_identical(back["qzeros"], qz, "qzeros", "round trip", "original")
        require_identical(back["scales"], s, "scales", "round trip", "original")
        codes = w4_gemv.unpack(layer["qweight"], layer["meta"])
        require_identical(codes, awq_gemm.unpack(qw).t().contiguous(), "w4-gemv codes", "w4-gemv", "AWQ")
        for dname, dtype in DTYPES.items():
            require_identical(w4_gemv.dequantize(**layer, dtype=dtype), awq_gemm.dequantize(qw, qz, s, dtype=dtype),
                              f"{dname} dequantize", "w4-gemv", "AWQ")
        return "words round-trip bit-exact; w4-gemv codes and dequantize (fp16/bf16/fp32) == AWQ"

    return body


def _ref_gemv(shape: Shape, seed: int) -> Callable[[], str]:
    def body() -> str:
        layer = gemv_layer(shape, seed, exact=True)
        x, bias = activations(shape, seed, exact=True)
        ref = w4_gemv.gemv_reference(x, **layer, bias=bias).half()
        w = restated_dequantize(*_awq_of(layer), torch.float64, True)
        restated = (x.double() @ w.t() + bias.double()).half()
        require_identical(raw_bits(ref + 0), raw_bits(restated + 0), f"M={M_MAX}", "reference", "float64 restatement")
        return f"M={M_MAX}: fp32 reference == float64 restatement, bit for bit"

    return body


def _awq_of(layer: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    awq = w4_gemv.to_awq(**layer)
    return awq["qweight"], awq["qzeros"], awq["scales"]


def _gpu_dequantize(kernels, shape: Shape, qw, qz, s, refs) -> Callable[[], str]:
    def body() -> str:
        if not refs:
            raise Mismatch("no reference to compare with (the ref dequantize check failed)")
        gq, gz, gs = qw.cuda(), qz.cuda(), s.cuda()
        for (dname, lname), ref in refs.items():
            out = kernels.dequantize_awq(gq, gz, gs, dtype=DTYPES[dname], transpose=LAYOUTS[lname])
            require_identical(out, ref, f"{dname} {lname}", "kernel", "reference")
        done = f"{len(refs)} AWQ outputs"
        if shape.gemv_legal:
            layer = {k: v.cuda() for k, v in w4_gemv.repack_from_awq(qw, qz, s).items()}
            awq = w4_gemv.to_awq(**layer)
            for dname, dtype in DTYPES.items():
                out = kernels.dequantize_awq(awq["qweight"], awq["qzeros"], awq["scales"], dtype=dtype, transpose=True)
                require_identical(out, refs[(dname, "[N,K]")], f"w4-gemv {dname}", "kernel", "reference")
            done += " + 3 from w4-gemv"
        return f"{done} bit-identical"

    return body


def _gpu_repack(qw, qz, s) -> Callable[[], str]:
    def body() -> str:
        cpu = w4_gemv.repack_from_awq(qw, qz, s)
        gpu = w4_gemv.repack_from_awq(qw.cuda(), qz.cuda(), s.cuda())
        for name in ("qweight", "qzeros", "scales", "meta"):
            require_identical(gpu[name], cpu[name], name, "GPU", "CPU")
        back = w4_gemv.to_awq(**gpu)
        require_identical(back["qweight"], qw, "to_awq on the GPU", "round trip", "original")
        return "repack and to_awq on the GPU == CPU, word for word"

    return body


def _gpu_gemv_exact(kernels, shape: Shape, seed: int) -> Callable[[], str]:
    def body() -> str:
        layer = gemv_layer(shape, seed, exact=True)
        x, bias = activations(shape, seed, exact=True)
        want = w4_gemv.gemv_reference(x, **layer, bias=bias).half()  # every fp32 sum is exact: rounds once
        glayer = {k: v.cuda() for k, v in layer.items()}
        gx, gb = x.cuda(), bias.cuda()
        for m in range(1, M_MAX + 1):
            out = kernels.gemv(gx[:m].contiguous(), **glayer, bias=gb)
            # + 0 maps -0.0 to +0.0: the one sign difference a different exact summation order makes
            require_identical(raw_bits(out.cpu() + 0), raw_bits(want[:m] + 0), f"M={m}", "kernel", "reference")
        return f"M=1..{M_MAX} bit-identical to the fp32 reference rounded once"

    return body


def _gpu_gemv_random(kernels, shape: Shape, seed: int) -> Callable[[], str]:
    def body() -> str:
        layer = gemv_layer(shape, seed, exact=False)
        x, bias = activations(shape, seed, exact=False)
        glayer = {k: v.cuda() for k, v in layer.items()}
        w16 = w4_gemv.dequantize(**glayer, dtype=torch.float16)  # the weights the kernel multiplies
        gx, gb = x.cuda(), bias.cuda()
        worst = (0.0, 0.0, 0.0, float("inf"))
        for m in range(1, M_MAX + 1):
            xm = gx[:m].contiguous()
            out = kernels.gemv(xm, **glayer, bias=gb)
            try:
                metrics = gemv_error(out, xm, w16, gb)
            except Mismatch as exc:
                raise Mismatch(f"M={m}: {exc}") from None
            again = kernels.gemv(xm, **glayer, bias=gb)
            require_identical(again, out, f"M={m} second run", "run 2", "run 1")
            worst = (max(worst[0], metrics[0]), max(worst[1], metrics[1]), max(worst[2], metrics[2]), min(worst[3], metrics[3]))
        return (f"M=1..{M_MAX} within bound (worst err/bound {worst[0]:.3f}); max|err| {worst[1]:.3g}, "
                f"mean-rel {worst[2]:.3g}, SQNR {worst[3]:.1f} dB; deterministic")

    return body


COMPARED = {
    "ref dequantize": "CPU reference vs restatement; 3 dtypes x 2 layouts; bits",
    "ref repack": "repack round trip; w4-gemv vs AWQ dequantize; bits",
    "ref gemv": "gemv_reference vs float64, exact data; bits",
    "gpu dequantize": "kernel vs CPU reference; 3 dtypes x 2 layouts, w4-gemv; bits",
    "gpu repack": "repack / to_awq on GPU vs CPU; words",
    "gpu gemv exact": "kernel vs fp32 ref rounded once; M=1..8, exact data; bits",
    "gpu gemv random": "kernel vs float64 ref; M=1..8; |err| <= 2^-10|ref| + 4K 2^-24 |x||W|",
}


def run(report: Report, gpu: Gpu, seed: int, quick: bool, require_gpu: bool) -> None:
    selected = shapes(quick)
    total = sum(7 if s.gemv_legal else 2 for s in selected)
    with steps("w4 verify: self-test", total) as advance:
        for shape in selected:
            label = shape.label

            def check(kind: str, body: Callable[[], str], needs_gpu: bool = False) -> None:
                name = f"{kind} {label}"
                if needs_gpu and not gpu.usable:
                    skip(report, name, COMPARED[kind], gpu.reason, GROUP, require_gpu)
                else:
                    run_check(report, name, COMPARED[kind], body, GROUP, needs_gpu)
                advance(name)

            qw, qz, s = dequant_layer(shape, seed)
            refs: dict[tuple[str, str], torch.Tensor] = {}
            check("ref dequantize", _ref_dequantize(qw, qz, s, refs))
            if shape.gemv_legal:
                check("ref repack", _ref_repack(qw, qz, s))
                check("ref gemv", _ref_gemv(shape, seed))
            check("gpu dequantize", _gpu_dequantize(gpu.kernels, shape, qw, qz, s, refs), needs_gpu=True)
            if shape.gemv_legal:
                check("gpu repack", _gpu_repack(qw, qz, s), needs_gpu=True)
                check("gpu gemv exact", _gpu_gemv_exact(gpu.kernels, shape, seed), needs_gpu=True)
                check("gpu gemv random", _gpu_gemv_random(gpu.kernels, shape, seed), needs_gpu=True)
            del refs

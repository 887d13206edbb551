"""`w4 verify` with no target: the kernels and their references over a fixed matrix of shapes.

Per shape (K = in_features, N = out_features, G = group size), with words drawn from the FULL
32-bit range (sign bit included: `>>` on int32 is arithmetic, and upstream tests that draw from
[0, 2^31) never set the top nibble >= 8):

    ref dequantize   awq_gemm.dequantize (the CPU path of `w4 dequantize`, the oracle) vs an
                     independent restatement, fp16/bf16/fp32 x [N,K]/[K,N], raw bits
    ref repack       w4_gemv.to_awq(repack_from_awq(x)) == x word for word; w4-gemv unpack == AWQ
                     unpack; w4-gemv dequantize == the restatement, raw bits
    ref gemv         w4_gemv.gemv_reference rounded to fp16 == a float64 restatement, exact data
    gpu dequantize   kernels.dequantize_awq vs the CPU reference, every dtype and output layout,
                     from AWQ tensors and from w4-gemv tensors (to_awq on the GPU), raw bits
    gpu repack       repack_from_awq / to_awq on the GPU == on the CPU, word for word
    gpu gemv exact   kernels.gemv, M = 1..8, 16, 32, 64, 65, 128, 129, 257 (every kernel path), x in {-1, 0, 1}, scales +-2^-6..2^-3, bias on a 2^-6
                     grid: every fp32 sum is exact, so out == fp32 reference rounded once, bit for bit
    gpu gemv random  kernels.gemv, the same M, normal x, real-checkpoint scales: inside the bound of
                     w4cli/gpu/checks.py against a float64 reference; two runs bit-identical

Shapes the GEMV kernel cannot take (K % 8, G neither a multiple of 32 nor K) get the dequantize
rows only. The ref rows take each layer in blocks of output channels (BLOCK_WEIGHTS weights, every
k and group), all blocks of a small layer and REF_BLOCKS spread over a large one, so the CPU-only
run fits a minute and a few hundred MB on two cores; the gpu rows take every layer whole.
Everything is seeded from --seed, so two runs print the same report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from w4cli.gpu.checks import Mismatch, gemv_errors, raw_bits, require_identical
from w4cli.gpu.contract import CHECKED_BATCHES, GEMV_MAX_M, OUT_DTYPES, checked_batches_text, gemv_refusal
from w4cli.dequantize import DTYPES
from w4cli.formats import awq_gemm, w4_gemv
from w4cli.verify.environment import Gpu
from w4cli.console import steps
from w4cli.verify.report import PASS, Check, Report, run_check, skip

GROUP = "selftest"
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
        return gemv_refusal(self.k, self.n, self.g, str(self.scale_dtype).removeprefix("torch.")) is None


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
    def normal(groups: int, n: int, gen: torch.Generator) -> torch.Tensor:
        return (torch.randn(groups, n, generator=gen) * 0.02).to(shape.scale_dtype)

    qweight, qzeros, scales = awq_gemm.random_layer(shape.k, shape.n, shape.g, _generator(seed, shape, 1), normal)
    scales[scales == 0] = 0.01
    flat = scales.view(-1)
    extremes = torch.tensor(EXTREME_SCALES[: flat.numel()]).to(shape.scale_dtype)
    flat[: extremes.numel()] = extremes
    return qweight, qzeros, scales


# -> qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N] fp16 of a random layer for
# the GEMV checks; exact: scales +-2^-6..2^-3, else 2^-9..2^-4 (real AWQ)
def gemv_awq(shape: Shape, seed: int, exact: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    def signed_exp2(groups: int, n: int, gen: torch.Generator) -> torch.Tensor:
        sign = torch.randint(0, 2, (groups, n), generator=gen) * 2 - 1
        if exact:
            expo = torch.randint(-6, -2, (groups, n), generator=gen).float()
        else:
            expo = torch.rand(groups, n, generator=gen) * 5 - 9
        return (sign * torch.exp2(expo)).half()

    return awq_gemm.random_layer(shape.k, shape.n, shape.g, _generator(seed, shape, 2 if exact else 3), signed_exp2)


# -> x [max(CHECKED_BATCHES), K] fp16 and bias [N] fp16; exact: x in {-1, 0, 1}, bias on a 2^-6 grid
def activations(shape: Shape, seed: int, exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = _generator(seed, shape, 4 if exact else 5)
    if exact:
        x = torch.randint(-1, 2, (max(CHECKED_BATCHES), shape.k), generator=gen).half()
        bias = (torch.randint(-64, 64, (shape.n,), generator=gen) * 2.0**-6).half()
    else:
        x = torch.randn(max(CHECKED_BATCHES), shape.k, generator=gen).half()
        bias = torch.randn(shape.n, generator=gen).half()
    return x, bias


# weights per block in the ref rows: their float64 and int64 temporaries stay tens of MB
BLOCK_WEIGHTS = 1 << 21
# most blocks a ref row checks per layer, so the CPU-only run fits a minute on two cores
REF_BLOCKS = 4


def column_blocks(shape: Shape) -> list[slice]:
    """Slices of packed words (8 output channels each) that cover N in blocks of at most
    BLOCK_WEIGHTS weights. Every output channel depends only on its own column of qweight, qzeros
    and scales, so a block is a complete layer of its own, with every k and every group."""
    words = shape.n // 8
    per_block = max(1, BLOCK_WEIGHTS // (shape.k * 8))
    return [slice(start, min(words, start + per_block)) for start in range(0, words, per_block)]


def ref_blocks(shape: Shape) -> list[slice]:
    """The blocks the ref rows check: all of a small layer; of a large one the first, the last and
    evenly spaced ones between, REF_BLOCKS in all. The rest is the same arithmetic on other random
    words; the gpu rows take every layer whole."""
    blocks = column_blocks(shape)
    if len(blocks) <= REF_BLOCKS:
        return blocks
    picked = sorted({round(i * (len(blocks) - 1) / (REF_BLOCKS - 1)) for i in range(REF_BLOCKS)})
    return [blocks[i] for i in picked]


def coverage(shape: Shape, blocks: list[slice]) -> str:
    total = len(column_blocks(shape))
    if len(blocks) == total:
        return f"{shape.k * shape.n:,} weights"
    weights = sum(shape.k * 8 * (b.stop - b.start) for b in blocks)
    return f"{weights:,} of {shape.k * shape.n:,} weights: {len(blocks)} of {total} blocks of output channels"


def channels(words: slice) -> str:
    return f"channels {words.start * 8}..{words.stop * 8 - 1}"


def block_of(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, words: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    columns = slice(words.start * 8, words.stop * 8)
    return qweight[:, words].contiguous(), qzeros[:, words].contiguous(), scales[:, columns].contiguous()


# ---- independent restatements ----------------------------------------------------------------


# packed [R, C/8] int32 -> [R, C] int32 codes: arithmetic shifts of the signed word, then a mask,
# gathered back by the documented nibble table (docs/formats.md), not by w4cli's own unpack
def restated_unpack(packed: torch.Tensor) -> torch.Tensor:
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # [R, C/8, 8], nibble i at index i
    reverse = torch.tensor(awq_gemm.AWQ_REVERSE_ORDER)  # channel j sits in nibble reverse[j]
    return nibbles[:, :, reverse].reshape(packed.shape[0], -1)


def restated_exact(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """[K, N] float64 (q - z) * s: integers times float64 scales, each group's zeros and scales
    broadcast over its G rows. The product has at most 15 significant bits, so the float64 value
    is exact and casting it is the only rounding."""
    k, groups = qweight.shape[0], scales.shape[0]
    q = restated_unpack(qweight).view(groups, k // groups, -1)
    z = restated_unpack(qzeros).view(groups, 1, -1)
    return ((q - z).to(torch.float64) * scales.to(torch.float64).view(groups, 1, -1)).view(k, -1)


def restated_dequantize(exact: torch.Tensor, dtype: torch.dtype, transpose: bool) -> torch.Tensor:
    return (exact.t() if transpose else exact).to(dtype).contiguous()


# ---- checks ----------------------------------------------------------------------------------


LAYOUTS = {"[N,K]": True, "[K,N]": False}


def _ref_dequantize(shape: Shape, qw, qz, s) -> Callable[[], str]:
    def body() -> str:
        blocks = ref_blocks(shape)
        for words in blocks:
            bq, bz, bs = block_of(qw, qz, s, words)
            exact = restated_exact(bq, bz, bs)
            for name, dname in OUT_DTYPES.items():
                dtype = DTYPES[name]
                for lname, transpose in LAYOUTS.items():
                    ref = awq_gemm.dequantize(bq, bz, bs, dtype=dtype, transpose=transpose)
                    require_identical(ref, restated_dequantize(exact, dtype, transpose), f"{dname} {lname} {channels(words)}",
                                      "reference", "restatement")
        return f"{len(DTYPES) * len(LAYOUTS)} outputs bit-identical ({coverage(shape, blocks)})"

    return body


def _ref_repack(shape: Shape, qw, qz, s) -> Callable[[], str]:
    def body() -> str:
        blocks = ref_blocks(shape)
        for words in blocks:
            bq, bz, bs = block_of(qw, qz, s, words)
            where = channels(words)
            layer = w4_gemv.repack_from_awq(bq, bz, bs)
            back = w4_gemv.to_awq(**layer)
            require_identical(back["qweight"], bq, f"to_awq(repack(qweight)) {where}", "round trip", "original")
            require_identical(back["qzeros"], bz, f"qzeros {where}", "round trip", "original")
            require_identical(back["scales"], bs, f"scales {where}", "round trip", "original")
            codes = w4_gemv.unpack(layer["qweight"], layer["meta"])
            require_identical(codes, awq_gemm.unpack(bq).t().contiguous(), f"w4-gemv codes {where}", "w4-gemv", "AWQ")
            exact = restated_exact(bq, bz, bs)
            for name, dname in OUT_DTYPES.items():
                dtype = DTYPES[name]
                require_identical(w4_gemv.dequantize(**layer, dtype=dtype), restated_dequantize(exact, dtype, True),
                                  f"{dname} dequantize {where}", "w4-gemv", "restatement")
        return f"words round-trip bit-exact; w4-gemv codes == AWQ's; w4-gemv dequantize (fp16/bf16/fp32) == restatement ({coverage(shape, blocks)})"

    return body


def _ref_gemv(shape: Shape, seed: int) -> Callable[[], str]:
    def body() -> str:
        qw, qz, s = gemv_awq(shape, seed, exact=True)
        x, bias = activations(shape, seed, exact=True)
        x = x[:GEMV_MAX_M]  # the reference's arithmetic is the same at every M; the CPU time is not
        blocks = ref_blocks(shape)
        for words in blocks:
            bq, bz, bs = block_of(qw, qz, s, words)
            b = bias[words.start * 8 : words.stop * 8]
            ref = w4_gemv.gemv_reference(x, **w4_gemv.repack_from_awq(bq, bz, bs), bias=b).half()
            w = restated_dequantize(restated_exact(bq, bz, bs), torch.float64, True)
            restated = (x.double() @ w.t() + b.double()).half()
            require_identical(raw_bits(ref + 0), raw_bits(restated + 0), f"M={GEMV_MAX_M} {channels(words)}", "reference", "float64 restatement")
        return f"M={GEMV_MAX_M}: fp32 reference == float64 restatement, bit for bit ({coverage(shape, blocks)})"

    return body


def _gpu_dequantize(kernels, shape: Shape, qw, qz, s, reference_checked: bool) -> Callable[[], str]:
    def body() -> str:
        if not reference_checked:
            raise Mismatch("no reference to compare with (the ref dequantize check failed)")
        gq, gz, gs = qw.cuda(), qz.cuda(), s.cuda()
        for name, dname in OUT_DTYPES.items():
            dtype = DTYPES[name]
            for lname, transpose in LAYOUTS.items():
                out = kernels.dequantize_awq(gq, gz, gs, dtype=dtype, transpose=transpose)
                require_identical(out, awq_gemm.dequantize(qw, qz, s, dtype=dtype, transpose=transpose), f"{dname} {lname}", "kernel", "reference")
        done = f"{len(DTYPES) * len(LAYOUTS)} AWQ outputs"
        if shape.gemv_legal:
            layer = {k: v.cuda() for k, v in w4_gemv.repack_from_awq(qw, qz, s).items()}
            awq = w4_gemv.to_awq(**layer)
            for name, dname in OUT_DTYPES.items():
                dtype = DTYPES[name]
                out = kernels.dequantize_awq(awq["qweight"], awq["qzeros"], awq["scales"], dtype=dtype, transpose=True)
                require_identical(out, awq_gemm.dequantize(qw, qz, s, dtype=dtype), f"w4-gemv {dname}", "kernel", "reference")
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
        layer = w4_gemv.repack_from_awq(*gemv_awq(shape, seed, exact=True))
        x, bias = activations(shape, seed, exact=True)
        want = w4_gemv.gemv_reference(x, **layer, bias=bias).half()  # every fp32 sum is exact: rounds once
        glayer = {k: v.cuda() for k, v in layer.items()}
        gx, gb = x.cuda(), bias.cuda()
        for m in CHECKED_BATCHES:
            out = kernels.gemv(gx[:m].contiguous(), **glayer, bias=gb)
            # + 0 maps -0.0 to +0.0: the one sign difference a different exact summation order makes
            require_identical(raw_bits(out.cpu() + 0), raw_bits(want[:m] + 0), f"M={m}", "kernel", "reference")
        return f"M={checked_batches_text()} bit-identical to the fp32 reference rounded once"

    return body


def _gpu_gemv_random(kernels, shape: Shape, seed: int) -> Callable[[], str]:
    def body() -> str:
        layer = w4_gemv.repack_from_awq(*gemv_awq(shape, seed, exact=False))
        x, bias = activations(shape, seed, exact=False)
        glayer = {k: v.cuda() for k, v in layer.items()}
        w16 = w4_gemv.dequantize(**glayer, dtype=torch.float16)  # the weights the kernel multiplies
        gx, gb = x.cuda(), bias.cuda()
        runs = []
        for m in CHECKED_BATCHES:
            xm = gx[:m].contiguous()
            out = kernels.gemv(xm, **glayer, bias=gb)
            try:
                runs.append(gemv_errors(out, xm, w16, gb).require())
            except Mismatch as exc:
                raise Mismatch(f"M={m}: {exc}") from None
            again = kernels.gemv(xm, **glayer, bias=gb)
            require_identical(again, out, f"M={m} second run", "run 2", "run 1")
        return (f"M={checked_batches_text()} within bound (worst err/bound {max(e.worst_over_bound for e in runs):.3f}); "
                f"max|err| {max(e.max_abs_err for e in runs):.3g}, mean-rel {max(e.mean_rel_err for e in runs):.3g}, "
                f"SQNR {min(e.sqnr_db for e in runs):.1f} dB; deterministic")

    return body


COMPARED = {
    "ref dequantize": "CPU reference vs restatement; 3 dtypes x 2 layouts; bits",
    "ref repack": "repack round trip; w4-gemv codes vs AWQ; w4-gemv dequantize vs restatement; bits",
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

            def check(kind: str, body: Callable[[], str], needs_gpu: bool = False) -> Check:
                name = f"{kind} {label}"
                if needs_gpu and not gpu.usable:
                    done = skip(report, name, COMPARED[kind], gpu.reason, GROUP, require_gpu)
                else:
                    done = run_check(report, name, COMPARED[kind], body, GROUP, needs_gpu)
                advance(name)
                return done

            qw, qz, s = dequant_layer(shape, seed)
            reference = check("ref dequantize", _ref_dequantize(shape, qw, qz, s))
            if shape.gemv_legal:
                check("ref repack", _ref_repack(shape, qw, qz, s))
                check("ref gemv", _ref_gemv(shape, seed))
            check("gpu dequantize", _gpu_dequantize(gpu.kernels, shape, qw, qz, s, reference.status == PASS), needs_gpu=True)
            if shape.gemv_legal:
                check("gpu repack", _gpu_repack(qw, qz, s), needs_gpu=True)
                check("gpu gemv exact", _gpu_gemv_exact(gpu.kernels, shape, seed), needs_gpu=True)
                check("gpu gemv random", _gpu_gemv_random(gpu.kernels, shape, seed), needs_gpu=True)

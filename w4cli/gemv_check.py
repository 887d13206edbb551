"""Run w4's GEMV kernel on one linear, check it against the fp32 reference, then time it.

Used by `w4 gemv` (checkpoint layers or random shapes). Correctness gates speed: a layer whose
output is outside the bound (w4cli/checks.py) gets no time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from w4cli.formats import awq_gemm, w4_gemv
from w4cli.checks import gemv_errors


@dataclass
class GemvResult:
    layer: str
    k: int
    n: int
    group_size: int
    batch: int
    device: str  # "cuda": the kernel ran; "cpu": the reference alone
    max_abs_err: float | None = None
    rel_err: float | None = None
    worst_err_over_bound: float | None = None
    passed: bool | None = None  # None: nothing was checked (reference only)
    median_us: float | None = None
    gbps: float | None = None
    pct_of_copy: float | None = None
    cold_l2: bool | None = None  # False: even the largest rotation fits in 4x L2, the time is optimistic

    def as_dict(self) -> dict:
        return asdict(self)


def gemv_bytes(k: int, n: int, group_size: int, batch: int) -> int:
    """Bytes one call must move: int4 weights, fp16 scales, int4 zeros, fp16 x in and y out."""
    groups = k // group_size
    return k * n // 2 + groups * n * 2 + groups * n // 2 + batch * k * 2 + batch * n * 2


def random_awq(k: int, n: int, group_size: int, seed: int) -> dict[str, torch.Tensor]:
    """A random AWQ layer: packed words over the full int32 range, scales small and positive so
    outputs stay well inside fp16."""
    gen = torch.Generator().manual_seed(seed)
    groups = k // group_size

    scales = (torch.rand(groups, n, generator=gen) * 0.01 + 0.002).half()
    return {"qweight": awq_gemm.random_words((k, n // 8), gen), "qzeros": awq_gemm.random_words((groups, n // 8), gen), "scales": scales}


def check_layer(
    name: str,
    layer: dict[str, torch.Tensor],
    bias: torch.Tensor | None,
    batch: int,
    seed: int,
    device: str,
    time_it: bool = True,
    copy=None,
) -> GemvResult:
    """layer: one linear's w4-gemv tensors (qweight, qzeros, scales, meta), on the CPU."""
    k, n, g = w4_gemv.validate(layer["qweight"], layer["qzeros"], layer["scales"], layer["meta"])
    result = GemvResult(name, k, n, g, batch, device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, k, generator=gen).half()
    if device == "cpu":
        w4_gemv.gemv_reference(x, *(layer[s] for s in w4_gemv.TENSOR_NAMES), bias=bias)
        return result

    from w4cli import kernels

    on_gpu = {suffix: t.cuda() for suffix, t in layer.items()}
    x, bias = x.cuda(), (bias.cuda() if bias is not None else None)
    # [N, K] fp16: exactly the weight the kernel multiplies
    weight = w4_gemv.dequantize(*(on_gpu[s] for s in w4_gemv.TENSOR_NAMES), dtype=torch.float16)

    def run(x_, qweight, qzeros, scales):
        return kernels.gemv(x_, qweight, qzeros, scales, bias=bias)

    out = run(x, on_gpu["qweight"], on_gpu["qzeros"], on_gpu["scales"])
    errors = gemv_errors(out, x, weight, bias)
    result.max_abs_err = errors.max_abs_err
    result.rel_err = errors.rel_err
    result.worst_err_over_bound = errors.worst_over_bound
    result.passed = errors.passed
    if not result.passed or not time_it:
        return result

    from w4cli import timing

    def make(i: int):
        g_ = torch.Generator(device="cuda").manual_seed(seed + 1 + i)
        x_i = torch.randn(batch, k, generator=g_, device="cuda").half()
        return x_i, on_gpu["qweight"].clone(), on_gpu["qzeros"].clone(), on_gpu["scales"].clone()

    def check(out_, args) -> bool:
        gemv_errors(out_, args[0], weight, bias).require()

    measured = timing.measure(run, make, bytes_moved=gemv_bytes(k, n, g, batch), check=check, name=name, copy=copy)
    result.median_us, result.gbps, result.pct_of_copy = measured.median_us, measured.gbps, measured.pct_of_copy
    result.cold_l2 = measured.working_set_bytes >= 4 * measured.l2_bytes
    return result

"""`w4 gemv`: run w4's W4A16 kernels (the one w4cli.gpu.kernels.gemv picks for the batch size, named in
the table's "kernel" column) on checkpoint layers or a random shape, check every output
against the float64 reference (w4cli/gpu/checks.py), then time it (w4cli/bench/cases.py). Correctness
gates speed: a layer whose output is outside the bound gets no time."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fnmatch import fnmatch
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from w4cli import console
from w4cli.gpu import contract
from w4cli.bench.shapes import MAX_BATCH, check_group, parse_shape
from w4cli.errors import CheckFailed, EnvironmentUnavailable, UsageError
from w4cli.options import SEED_MAX, CacheDirOpt, Device, DeviceOpt, JsonOpt, RevisionOpt, TokenOpt, not_empty


@dataclass
class GemvResult:
    layer: str
    k: int
    n: int
    group_size: int
    batch: int
    device: str  # "cuda": the kernel ran; "cpu": the reference alone
    kernel: str | None = None  # the path w4cli.gpu.kernels.gemv took at this M (kernels.gemv_path)
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

EXAMPLES = [
    "w4 gemv ./qwen-w4 --layer '*.mlp.*' --batch 4",
    "w4 gemv --shape 8192x28672 --json gemv.json",
]


def _device(device: Device) -> str:
    if device is Device.cpu:
        console.note("note: --device cpu runs the fp32 reference alone; no kernel is checked or timed")
        return "cpu"
    from w4cli.gpu import kernels

    usable, reason = kernels.probe()
    if not usable:
        raise EnvironmentUnavailable(f"{reason} (pass --device cpu to run the reference alone)")
    return "cuda"


def _model_layers(model: str, patterns: list[str], revision, token, cache_dir):
    """(name, w4-gemv tensors, bias) for each selected linear, converted in memory from AWQ, GPTQ
    or compressed-tensors (repack.w4_gemv_layer)."""
    from w4cli.repack import w4_gemv_layer
    from w4cli.read.source import open_quantized, resolve

    quantized = open_quantized(resolve(model, revision, token, cache_dir).path)
    selected = [
        layer for prefix, layer in quantized.layers.items() if not patterns or any(fnmatch(prefix, p) or prefix == p for p in patterns)
    ]
    if not selected:
        raise UsageError(f"no quantized layer matches --layer {' '.join(patterns)}")
    checkpoint = quantized.checkpoint
    for layer in selected:
        tensors = w4_gemv_layer(quantized, layer, checkpoint.read(*layer.tensor_names))
        bias = checkpoint.read_one(layer.bias).half() if layer.bias else None
        yield layer.prefix, tensors, bias


def _random_shape(text: str, group_size: int) -> tuple[int, int]:
    k, n = parse_shape(text)
    why = contract.gemv_refusal(k, n, k if group_size == -1 else group_size)
    if why:
        raise UsageError(f"--shape {text}: {why}")
    return k, n


def _random_layers(shapes: list[tuple[int, int]], group_size: int, seed: int):
    import torch

    from w4cli.formats import awq_gemm, w4_gemv

    for i, (k, n) in enumerate(shapes):
        awq = awq_gemm.random_layer(k, n, k if group_size == -1 else group_size, torch.Generator().manual_seed(seed + i))
        yield f"random {k}x{n}", w4_gemv.repack_from_awq(*awq), None


# layer: one linear's w4-gemv tensors (qweight, qzeros, scales, meta) on the CPU; bias [N] fp16 | None
def _check_layer(name: str, layer: dict, bias, batch: int, seed: int, device: str, time_it: bool, copy) -> GemvResult:
    import torch

    from w4cli.formats import w4_gemv

    k, n, g = w4_gemv.validate(*(layer[s] for s in w4_gemv.TENSOR_NAMES))
    result = GemvResult(name, k, n, g, batch, device)
    if device == "cpu":
        x = torch.randn(batch, k, generator=torch.Generator().manual_seed(seed)).half()
        w4_gemv.gemv_reference(x, *(layer[s] for s in w4_gemv.TENSOR_NAMES), bias=bias)
        return result

    from w4cli.gpu import kernels, timing
    from w4cli.bench import cases

    result.kernel = kernels.gemv_path(batch, k, n)
    on_gpu = cases.CheckpointLayer(layer, bias, seed)
    case = cases.W4_GEMV_KERNEL.case(on_gpu, batch)
    args = case.inputs(0)
    errors = cases.w4_gemv_errors(on_gpu, case.run(*args), args)
    result.max_abs_err, result.rel_err = errors.max_abs_err, errors.rel_err
    result.worst_err_over_bound, result.passed = errors.worst_over_bound, errors.passed
    if result.passed and time_it:
        t = case.measure(copy)
        result.median_us, result.gbps, result.pct_of_copy = t.median_us, t.gbps, t.pct_of_copy
        result.cold_l2 = t.working_set_bytes >= timing.L2_MULTIPLE * t.l2_bytes
    return result


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _render(results: list[GemvResult], device: str) -> None:
    if device != "cuda":
        # reference only: nothing was checked or timed, so there are no error or time columns
        table = Table(title="w4 gemv (reference only, no kernel ran)", title_justify="left")
        for column in ("layer", "K x N", "G", "M"):
            table.add_column(column, justify="left" if column == "layer" else "right")
        for r in results:
            table.add_row(Text(console.printable(r.layer)), f"{r.k}x{r.n}", str(r.group_size), str(r.batch))
        console.stdout.print(table)
        return
    table = Table(title="w4 gemv (kernel on cuda)", title_justify="left")
    for column in ("layer", "K x N", "G", "M", "kernel", "max abs err", "rel err (norm)", "err / bound", "result", "median us", "GB/s", "% of copy"):
        table.add_column(column, justify="left" if column == "layer" else "right")
    for r in results:
        verdict = "[green]pass[/]" if r.passed else "[bold red]FAIL[/]"
        table.add_row(
            Text(console.printable(r.layer)), f"{r.k}x{r.n}", str(r.group_size), str(r.batch), r.kernel or "-",
            _fmt(r.max_abs_err, ".3g"), _fmt(r.rel_err, ".3g"), _fmt(r.worst_err_over_bound, ".3f"),
            verdict, _fmt(r.median_us, ".2f") + ("" if r.cold_l2 is not False else " *"),
            _fmt(r.gbps, ",.0f"), _fmt(r.pct_of_copy, ".1f"),
        )
    console.stdout.print(table)
    if any(r.cold_l2 is False for r in results):
        console.note("* the layer is so small that its rotating copies fit in 4x the L2 cache: the time is optimistic")


@console.boundary
def gemv(
    model: Annotated[Optional[str], typer.Argument(help="AWQ or w4-repacked checkpoint: Hub repo id or directory.", show_default=False,
                                                  metavar="MODEL", parser=not_empty)] = None,
    layer: Annotated[Optional[list[str]], typer.Option("--layer", help="Layer prefix or glob (repeatable); default: every quantized layer.")] = None,
    shape: Annotated[Optional[list[str]], typer.Option("--shape", help="KxN of a random layer instead of MODEL (repeatable).")] = None,
    batch: Annotated[int, typer.Option("--batch", "-m", min=1, max=MAX_BATCH, help=f"Activation rows M. The kernel follows M, the layer and the GPU: up to {contract.GEMV_MAX_M} the GEMV, then a batch kernel (one read of the weight; on Hopper any M in one launch, elsewhere {contract.BATCH_MAX_M} rows per launch and dequantize + cuBLAS beyond {contract.BATCH_CHUNKED_MAX_M}); the table's kernel column names it.")] = 1,
    group: Annotated[int, typer.Option("--group", help="Group size for --shape (-1: one group).")] = 128,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Seed for activations and random weights.")] = 0,
    time_it: Annotated[bool, typer.Option("--time/--no-time", help="Time each layer that passes.")] = True,
    device: DeviceOpt = Device.auto,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    cache_dir: CacheDirOpt = None,
    json_file: JsonOpt = None,
) -> None:
    """Run w4's W4A16 GEMV kernel on real layers of a checkpoint (repacked in memory if AWQ) or on a random KxN shape, and check every output against the fp32 reference.

    Exit 1 when a layer is outside the tolerance (docs/kernels.md), 3 without a usable GPU unless --device cpu.
    """
    if (model is None) == (not shape):
        raise UsageError("give either MODEL or --shape KxN")
    if group != -1:
        check_group(group)
    shapes = [_random_shape(s, group) for s in shape or []]
    where = _device(device)
    layers = _random_layers(shapes, group, seed) if shapes else _model_layers(model, layer or [], revision, token, cache_dir)
    copy = None
    if where == "cuda" and time_it:
        from w4cli.gpu import timing

        copy = timing.copy_bandwidth()
    results = []
    checked: list[dict] = []
    console.record(layers=checked)
    with console.steps("gemv", None) as advance:
        for i, (name, tensors, bias) in enumerate(layers):
            results.append(_check_layer(name, tensors, bias, batch, seed + i, where, time_it, copy))
            checked.append(results[-1].as_dict())
            advance(name)
    document = {"device": where, "copy_gbps": copy.gbps if copy else None, "layers": [r.as_dict() for r in results]}
    console.result(document, json_file, lambda: _render(results, where))
    failed = [r.layer for r in results if r.passed is False]
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(results)} layers outside the tolerance, first: {failed[0]}")

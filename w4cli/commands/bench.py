"""`w4 bench`: fp16 cuBLAS, w4's GEMV, w4's dequantize + matmul and torch's int4 kernel, on this GPU,
for given shapes or a model's layers; every kernel checked before it is timed (w4cli/bench/).

Regenerate the tables of docs/performance.md (Llama-3-8B and Llama-3-70B layer shapes) on the GPU machine:

    w4 bench --shape 4096x4096 --shape 4096x1024 --shape 4096x14336 --shape 14336x4096 \
             --shape 8192x8192 --shape 8192x1024 --shape 8192x28672 --shape 28672x8192 \
             --batch 1,4,16 --markdown

(or `w4 bench meta-llama/Meta-Llama-3-8B --batch 1,4,16 --markdown`, which fetches config.json only,
adds lm_head as an fp16 layer and the per-token decode-step summary).
"""

from __future__ import annotations

import shlex
import sys
from typing import Annotated, Optional

import typer

from w4cli import console
from w4cli.gpu import contract
from w4cli.read import hub
from w4cli.bench import shapes
from w4cli.errors import CheckFailed, EnvironmentUnavailable, UsageError
from w4cli.options import CacheDirOpt, JsonOpt, RevisionOpt, TokenOpt, not_empty

DEFAULT_BATCHES = "1,2,4,8,16"
EXAMPLES = [
    "w4 bench --shape 8192x28672 --batch 1,4,16",
    "w4 bench Qwen/Qwen2.5-7B-Instruct-AWQ --batch 1,8 --json qwen7b.json",
    "w4 bench meta-llama/Meta-Llama-3-8B --dry-run",
]


@console.boundary
def bench(
    model: Annotated[
        Optional[str],
        typer.Argument(help="Hub repo id or local directory: measure its linear-layer shapes (reads config.json only).",
                       show_default=False, metavar="MODEL", parser=not_empty),
    ] = None,
    shape: Annotated[
        Optional[list[str]],
        typer.Option("--shape", help="KxN to measure (K = in_features, N = out_features); repeatable.", show_default=False),
    ] = None,
    batch: Annotated[str, typer.Option("--batch", help="Comma list of batch sizes M (rows of activations).")] = DEFAULT_BATCHES,
    group: Annotated[int, typer.Option("--group", help="Quantization group size along K.")] = 128,
    replays: Annotated[int, typer.Option("--replays", help="Timed CUDA-graph replays per measurement, at least (and at least 0.3 s of them; median reported).")] = 30,
    json_file: JsonOpt = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print markdown tables (for docs/performance.md) instead of Rich tables.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the shapes that would be measured and exit; needs no GPU.")] = False,
    fuse: Annotated[bool, typer.Option("--fuse/--no-fuse", help="MODEL: measure q/k/v and gate/up fused along N (qkv_proj, gate_up_proj), as serving engines run them; --no-fuse: one layer each.")] = True,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    cache_dir: CacheDirOpt = None,
) -> None:
    """Latency, GB/s and speedup of int4 kernels against fp16 cuBLAS, checked before timed.

    For every shape and batch size M: fp16 cuBLAS (F.linear), w4 GEMV, w4 dequantize + fp16 matmul, torch's int4 kernel (_weight_int4pack_mm, where this torch has it); and the dequantize kernel alone. A kernel whose output does not match its reference shows FAIL and no time, and the command exits 1. Method and byte counts: docs/bench.md.
    """
    batches = shapes.parse_batches(batch)
    shapes.check_group(group)
    if replays < 5 or replays > 10_000:
        raise UsageError(f"--replays {replays}: expected 5 to 10000")
    if json_file is not None and str(json_file) == "-" and markdown:
        raise UsageError("--json - and --markdown both write stdout: give --json a FILE")
    extra = []
    for text in shape or []:
        k, n = shapes.parse_shape(text)
        why = contract.gemv_refusal(k, n, group)
        if why:
            raise UsageError(f"--shape {text}: {why}")
        extra.append(shapes.Shape(k, n))
    if model is None and not extra:
        raise UsageError("give MODEL or at least one --shape KxN (e.g. w4 bench --shape 4096x4096)")

    model_shapes = None
    todo: list[shapes.Shape] = []
    if model is not None:
        from w4cli.read.safe_files import read_json

        snapshot = hub.resolve(model, revision=revision, token=token, cache_dir=cache_dir, patterns=hub.CONFIG_PATTERNS)
        model_shapes = shapes.from_config(read_json(snapshot.path / "config.json"), model)
        if fuse:
            model_shapes = model_shapes.fused()
        todo = model_shapes.shapes()
    have = {(s.k, s.n) for s in todo if s.quantized}
    todo += [s for s in extra if (s.k, s.n) not in have]

    if dry_run:
        _dry_run(todo, batches, group, model_shapes, json_file, markdown)
        return

    from w4cli.gpu import kernels

    usable, reason = kernels.probe()
    if not usable:
        raise EnvironmentUnavailable(f"w4 bench needs a CUDA GPU and the w4 kernels: {reason}")

    from w4cli.bench import render, runner

    with console.steps("bench", runner.steps_for(todo, batches, group, model_shapes)) as advance:
        report = runner.run(todo, batches, group, model=model_shapes, replays=replays, step=advance)
    report.environment["command"] = _command_line(model, shape or [], batch, group, replays, fuse)

    console.result(render.to_json(report), json_file, lambda: _show(report, markdown))
    if report.failures:
        first = report.failures[0]
        raise CheckFailed(f"{len(report.failures)} kernel check(s) failed; first: {first.note}")


def _command_line(model: str | None, shape_args: list[str], batch: str, group: int, replays: int, fuse: bool) -> str:
    parts = ["w4", "bench"] + ([model] if model else [])
    if model and not fuse:
        parts.append("--no-fuse")
    for s in shape_args:
        parts += ["--shape", s]
    parts += ["--batch", batch]
    if group != 128:
        parts += ["--group", str(group)]
    if replays != 30:
        parts += ["--replays", str(replays)]
    return shlex.join(parts)


def _show(report, markdown: bool) -> None:
    from w4cli.bench import render

    if markdown:
        sys.stdout.write(render.markdown(report))
        sys.stdout.flush()
        return
    if report.model is not None:
        console.stdout.print(render.shapes_table(report))
    console.stdout.print(render.results_table(report))
    for table in (render.summary_table(report), render.step_table(report), render.kind_table(report)):
        if table is not None:
            console.stdout.print(table)
    for line in render.notes(report):
        console.stdout.print(f"note: {line}", markup=False, highlight=False, style="dim")


def _dry_run(todo, batches, group, model_shapes, json_file, markdown) -> None:
    from w4cli.bench import render
    from w4cli.bench.results import Report

    report = Report({}, 0.0, "", group, batches, todo, [], model_shapes)
    doc = {"shapes": render.to_json(report)["shapes"], "batches": batches, "group_size": group, "notes": render.notes(report)}
    console.result(doc, json_file, lambda: _show_shapes(report, markdown))


def _show_shapes(report, markdown: bool) -> None:
    from w4cli.bench import render

    if markdown:
        sys.stdout.write(render.shapes_markdown(report))
        sys.stdout.flush()
        return
    console.stdout.print(render.shapes_table(report))
    for line in render.notes(report):
        console.stdout.print(f"note: {line}", markup=False, highlight=False, style="dim")

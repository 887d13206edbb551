"""The GPU side of `w4 bench`: every method of cases.py on every shape and batch size, each measured
with its case (check, then time, through w4cli/gpu/timing.py) and recorded as a Result: pass with its
times, FAIL (its output did not match the reference: no time), or skipped with why.

Per shape, in table order: the methods measured once per shape (the dequantize kernel alone), then
for every batch size M the others. A method that cannot take the shape (its refusal) is skipped
with the reason; unquantized layers (lm_head) get the fp16 rows only. Method (timing.py): one CUDA
graph per measurement over rotating input sets totalling >= 4x L2 (each set has its own weights, so
every call reads HBM), warm-up replays until the clocks settle, then the median of at least
`replays` timed replays (timing.WARMUP_MS, timing.TIMED_MS). The two methods the tables' ratio
compares (PAIRED) are timed twice each in a cell, in the order fp16, w4, w4, fp16, and each
reports the mean of its two medians, so that neither is always timed after the other
(docs/bench.md, "Method": an order effect measured with a short warm-up, none at steady state).
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Callable
from typing import Any

import torch

from w4cli import __version__
from w4cli.gpu import timing
from w4cli.bench import cases, step as decode_step
from w4cli.bench.cases import METHODS, Layer, Method
from w4cli.bench.results import FAIL, SKIPPED, Report, Result
from w4cli.bench.shapes import ModelShapes, Shape
from w4cli.errors import CheckFailed, EnvironmentUnavailable

DEV = "cuda"
PAIRED = (cases.FP16, cases.W4_GEMV)  # the ratio's two methods, timed fp16, w4, w4, fp16 in each cell

Step = Callable[[str], None]


def _one_line(exc: BaseException, limit: int = 160) -> str:
    """An exception as one short line: type, then its first sentence."""
    text = " ".join(str(exc).split())
    cut = text.find(". ")
    text = text[: cut + 1] if 0 < cut < limit else text
    return f"{type(exc).__name__}: {text[:limit]}" + ("..." if len(text) > limit else "")


def rows(shape: Shape, batches: list[int], group: int) -> list[tuple[Method, int | None, str | None]]:
    """(method, M, why it cannot run or None) for every row of one shape, in table order."""
    methods = [method for method in METHODS.values() if shape.quantized or not method.quantized]
    return [(method, m, method.refusal(shape.k, shape.n, group))
            for m in [None, *batches] for method in methods if method.batched == (m is not None)]


def paired_cells(todo: list[tuple[Method, int | None, str | None]]) -> set[int]:
    """The batch sizes of one shape's rows where both PAIRED methods run (each timed twice there)."""
    runnable = {(method.key, m) for method, m, why in todo if why is None}
    return {m for _, m, _ in todo if m is not None and all((key, m) in runnable for key in PAIRED)}


def steps_for(shapes: list[Shape], batches: list[int], group: int, model: ModelShapes | None = None) -> int:
    """How many step() calls run() makes (for a progress bar): the copy, one per measurement (two for
    each PAIRED method where both run), and for a dense MODEL the decode step (at every M lm_head,
    then each pass of step.PASS_ORDER: the step, and each layer kind alone for the breakdown
    methods)."""
    steps = 1
    for s in shapes:
        todo = rows(s, batches, group)
        steps += sum(why is None for _, _, why in todo) + len(PAIRED) * len(paired_cells(todo))
    plan = decode_step.plan(model) if model is not None else None
    if plan is not None and not isinstance(plan, str):
        per_m = 1 + sum(1 + len(plan.layer) * (method in decode_step.BREAKDOWN_METHODS)
                        for method in decode_step.PASS_ORDER)
        steps += len(batches) * per_m
    return steps


# one measurement -> its Timing, or the Result (FAIL or skipped) that says why there is none; never
# an exception for a kernel's fault
def _attempt(method: Method, layer: Layer, m: int | None, copy: timing.Timing, replays: int) -> timing.Timing | Result:
    k, n = layer.k, layer.n
    try:
        return method.case(layer, m).measure(copy, replays=replays)
    except CheckFailed as exc:
        return Result(k, n, m, method.key, FAIL, str(exc))
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return Result(k, n, m, method.key, SKIPPED, "out of GPU memory")
    except EnvironmentUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a kernel refusing or crashing on this shape
        return Result(k, n, m, method.key, SKIPPED if method.optional else FAIL, _one_line(exc))


def _passed(method: Method, layer: Layer, m: int | None, t: timing.Timing) -> Result:
    multiple = t.working_set_bytes / t.l2_bytes
    note = "" if multiple >= timing.L2_MULTIPLE else (
        f"working set {multiple:.1f}x L2 (wanted {timing.L2_MULTIPLE:g}x)" if multiple >= 1.5
        else f"working set {multiple:.2f}x L2: partly served from L2, optimistic")
    return Result.from_timing(layer.k, layer.n, m, method.key, t, note)


def _label(method: Method, shape: Shape, m: int | None) -> str:
    return f"{method.label} {shape.label}" + (f" M={m}" if m is not None else "")


def _measure_pair(shape: Shape, layer: Layer, m: int, copy: timing.Timing, replays: int,
                  step: Step) -> dict[str, Result]:
    """PAIRED's two methods at M, timed in the order A, B, B, A; each one's Result from the mean of
    its two medians, or the first of its attempts that has no time."""
    a, b = (METHODS[key] for key in PAIRED)
    attempts: dict[str, list[timing.Timing | Result]] = {a.key: [], b.key: []}
    for method in (a, b, b, a):
        step(_label(method, shape, m))
        attempts[method.key].append(_attempt(method, layer, m, copy, replays))
    out = {}
    for method in (a, b):
        first, second = attempts[method.key]
        failed = next((t for t in (first, second) if isinstance(t, Result)), None)
        out[method.key] = failed or _passed(method, layer, m, timing.combined(first, second))
    return out


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
    """Measure every shape at every batch size; needs a CUDA GPU and the w4 kernels (kernels.probe())."""
    step = step or (lambda label: None)
    results: list[Result] = []
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 references must be fp32
    try:
        step("copy bandwidth")
        copy = timing.copy_bandwidth(replays=replays)
        env = environment()
        for i, shape in enumerate(shapes):
            layer = Layer(shape.k, shape.n, group, seed=i + 1, device=DEV)
            todo = rows(shape, batches, group)
            paired = paired_cells(todo)
            pairs: dict[int, dict[str, Result]] = {}
            for method, m, why in todo:
                if why is not None:
                    results.append(Result(shape.k, shape.n, m, method.key, SKIPPED, why))
                elif m in paired and method.key in PAIRED:
                    if m not in pairs:
                        pairs[m] = _measure_pair(shape, layer, m, copy, replays, step)
                    results.append(pairs[m][method.key])
                else:
                    step(_label(method, shape, m))
                    t = _attempt(method, layer, m, copy, replays)
                    results.append(t if isinstance(t, Result) else _passed(method, layer, m, t))
            del layer
            torch.cuda.empty_cache()
        steps: list[decode_step.StepResult] = []
        why_not = None
        if model is not None:
            steps, why_not = decode_step.measure(model, batches, group, copy, replays, step, DEV, cases.kernels.gemv)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    env["copy_gbps"] = copy.gbps
    env["copy_method"] = copy.name
    env["replays"] = replays
    env["method"] = (f"each measurement: one CUDA graph over rotating input sets >= {timing.L2_MULTIPLE:g}x L2, "
                     f"{timing.WARMUP_MS / 1000:g} s of warm-up replays, median of at least {replays} timed replays "
                     f"over at least {timing.TIMED_MS / 1000:g} s (w4cli/gpu/timing.py); "
                     f"fp16 cuBLAS and the w4 path timed twice each in a cell (fp16, w4, w4, fp16), "
                     f"each the mean of its two medians")
    report = Report(env, copy.gbps, copy.name, group, batches, shapes, results, model, steps=steps)
    if why_not:
        report.notes.append(why_not)
    return report

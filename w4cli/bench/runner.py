"""The GPU side of `w4 bench`: every method of cases.py on every shape and batch size, each measured
with its case (check, then time, through w4cli/gpu/timing.py) and recorded as a Result: pass with its
times, FAIL (its output did not match the reference: no time), or skipped with why.

Per shape, in table order: the methods measured once per shape (the dequantize kernel alone), then
for every batch size M the others. A method that cannot take the shape (its refusal) is skipped
with the reason; unquantized layers (lm_head) get the fp16 rows only. Method (timing.py): one CUDA
graph per measurement over rotating input sets totalling >= 4x L2 (each set has its own weights, so
every call reads HBM), warm-up replays, then the median of `replays` timed replays.
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


def steps_for(shapes: list[Shape], batches: list[int], group: int, model: ModelShapes | None = None) -> int:
    """How many step() calls run() makes (for a progress bar): the copy, one per measurement, and
    for a dense MODEL the decode step (lm_head, fp16, w4, w4 with PDL at every M, and each layer
    kind alone for the breakdown methods)."""
    steps = 1 + sum(why is None for s in shapes for _, _, why in rows(s, batches, group))
    plan = decode_step.plan(model) if model is not None else None
    if plan is not None and not isinstance(plan, str):
        steps += len(batches) * (4 + len(decode_step.BREAKDOWN_METHODS) * len(plan.layer))
    return steps


# one measurement -> one Result (pass, FAIL or skipped), never an exception for a kernel's fault
def _measure(method: Method, layer: Layer, m: int | None, copy: timing.Timing, replays: int) -> Result:
    k, n = layer.k, layer.n
    try:
        t = method.case(layer, m).measure(copy, replays=replays)
    except CheckFailed as exc:
        return Result(k, n, m, method.key, FAIL, str(exc))
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return Result(k, n, m, method.key, SKIPPED, "out of GPU memory")
    except EnvironmentUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a kernel refusing or crashing on this shape
        return Result(k, n, m, method.key, SKIPPED if method.optional else FAIL, _one_line(exc))
    multiple = t.working_set_bytes / t.l2_bytes
    note = "" if multiple >= timing.L2_MULTIPLE else (
        f"working set {multiple:.1f}x L2 (wanted {timing.L2_MULTIPLE:g}x)" if multiple >= 1.5
        else f"working set {multiple:.2f}x L2: partly served from L2, optimistic")
    return Result.from_timing(k, n, m, method.key, t, note)


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
            for method, m, why in rows(shape, batches, group):
                if why is not None:
                    results.append(Result(shape.k, shape.n, m, method.key, SKIPPED, why))
                    continue
                step(f"{method.label} {shape.label}" + (f" M={m}" if m is not None else ""))
                results.append(_measure(method, layer, m, copy, replays))
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
                     f"3 warm-up replays, median of {replays} timed replays (w4cli/gpu/timing.py)")
    report = Report(env, copy.gbps, copy.name, group, batches, shapes, results, model, steps=steps)
    if why_not:
        report.notes.append(why_not)
    return report

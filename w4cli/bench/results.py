"""What a `w4 bench` run recorded, and the per-token projection for a model (no GPU).

A Result is one method on one shape at one batch size: passed (with its times), FAIL (its output
did not match the reference: no time is kept), or skipped (the method cannot run here, with why).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from w4cli.bench import cases
from w4cli.bench.shapes import Linear, ModelShapes, Shape

PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"


@dataclass
class Result:
    k: int
    n: int
    m: int | None  # None for the dequantize kernel alone
    method: str
    status: str
    note: str = ""
    bytes_moved: int | None = None
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    min_us: float | None = None
    spread: float | None = None  # (p90 - p10) / median
    gbps: float | None = None
    pct_of_copy: float | None = None
    replays: int | None = None
    input_sets: int | None = None
    working_set_bytes: int | None = None
    l2_bytes: int | None = None

    @classmethod
    def from_timing(cls, k: int, n: int, m: int | None, method: str, t: Any, note: str = "") -> "Result":
        """From a w4cli.gpu.timing.Timing."""
        return cls(k, n, m, method, PASS, note, t.bytes_moved, t.median_us, t.p10_us, t.p90_us, t.min_us, t.spread,
                   t.gbps, t.pct_of_copy, t.replays, t.input_sets, t.working_set_bytes, t.l2_bytes)

    @property
    def passed(self) -> bool:
        return self.status == PASS and self.median_us is not None

    @property
    def l2_multiple(self) -> float | None:
        """The rotating working set over the L2 size (the method wants >= 4)."""
        if not self.working_set_bytes or not self.l2_bytes:
            return None
        return self.working_set_bytes / self.l2_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["label"] = cases.label(self.method)
        d["l2_multiple"] = None if self.l2_multiple is None else round(self.l2_multiple, 2)
        return d


@dataclass
class Report:
    """Everything one run measured, ready to render."""

    environment: dict[str, Any]
    copy_gbps: float
    copy_name: str
    group: int
    batches: list[int]
    shapes: list[Shape]
    results: list[Result]
    model: ModelShapes | None = None
    notes: list[str] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)  # step.StepResult: the decode step as one graph

    def get(self, k: int, n: int, m: int | None, method: str) -> Result | None:
        for r in self.results:
            if (r.k, r.n, r.m, r.method) == (k, n, m, method):
                return r
        return None

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status == FAIL]


# ---- speedups and the per-token projection ----


def speedup(base: Result | None, other: Result | None) -> float | None:
    """base time / other time, when both passed."""
    if base is None or other is None or not base.passed or not other.passed:
        return None
    return base.median_us / other.median_us  # type: ignore[operator]


def expected_distinct_experts(experts: int, top_k: int, m: int) -> float:
    """Distinct experts M tokens touch under uniform top-k routing: E * (1 - (1 - k/E)^M)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** m)


def executions(lin: Linear, m: int, batches: list[int], experts: int, top_k: int) -> tuple[float, int]:
    """(calls per decode step at batch M, the measured batch size each call is timed at)."""
    if lin.kind != "expert" or not experts or not top_k:
        return float(lin.per_layer * lin.layers), m
    distinct = expected_distinct_experts(experts, top_k, m)
    rows = math.ceil(m * top_k / distinct - 1e-9)
    at = next((b for b in batches if b >= rows), batches[-1])
    return lin.layers * distinct, at


SUMMARY_METHODS = (cases.FP16, cases.W4_GEMV, cases.W4_DQ_MM, cases.TORCH_INT4)
W4_BEST = "w4_best"  # per layer, the faster of w4 GEMV and w4 dequant+mm


def project(report: Report) -> list[dict[str, Any]]:
    """Per batch size: all linear layers of one decode step, summed (time x calls), per method.

    Unquantized layers (lm_head) count as fp16 in every column. A column whose layers did not all
    pass is None. Speedups are over the fp16 column.
    """
    model = report.model
    if model is None:
        return []
    rows = []
    for m in report.batches:
        totals: dict[str, float | None] = {key: 0.0 for key in SUMMARY_METHODS + (W4_BEST,)}
        for lin in model.linears:
            calls, at = executions(lin, m, report.batches, model.num_experts, model.experts_per_token)
            fp16 = report.get(lin.k, lin.n, at, cases.FP16)
            times: dict[str, Result | None] = {}
            for method in SUMMARY_METHODS:
                times[method] = fp16 if (not lin.quantized or method == cases.FP16) else report.get(lin.k, lin.n, at, method)
            w4 = [times[cases.W4_GEMV], times[cases.W4_DQ_MM]]
            w4_ok = [r for r in w4 if r is not None and r.passed]
            best = min(w4_ok, key=lambda r: r.median_us) if w4_ok else None  # type: ignore[arg-type, return-value]
            times[W4_BEST] = fp16 if not lin.quantized else best
            for key, res in times.items():
                if totals[key] is None or res is None or not res.passed:
                    totals[key] = None
                else:
                    totals[key] += calls * res.median_us  # type: ignore[operator]
        row: dict[str, Any] = {"m": m, **{f"{key}_us": totals[key] for key in totals}}
        base = totals[cases.FP16]
        for key in (cases.W4_GEMV, cases.W4_DQ_MM, cases.TORCH_INT4, W4_BEST):
            row[f"{key}_speedup"] = base / totals[key] if base and totals[key] else None
        rows.append(row)
    return rows

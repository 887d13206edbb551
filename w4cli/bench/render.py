"""`w4 bench` output from recorded numbers: Rich tables, a markdown table for docs, one JSON document.

No GPU: everything here reads a results.Report, so it is tested with made-up numbers.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from w4cli.bench import cases
from w4cli.bench.results import FAIL, PASS, SKIPPED, W4_BEST, Report, Result, executions, project, speedup

JSON_VERSION = 1
_EIGHTHS = "▏▎▍▌▋▊▉"


def bar(x: float, width: int = 8, full: float = 4.0) -> str:
    """A small bar, `width` cells = `full`x (so 1x is a quarter of it)."""
    eighths = round(max(0.0, min(float(width), x / full * width)) * 8)
    return "█" * (eighths // 8) + (_EIGHTHS[eighths % 8 - 1] if eighths % 8 else "")


def _mib(b: int) -> str:
    return f"{b / 2**20:.0f} MiB"


def header(report: Report) -> str:
    e = report.environment
    parts = [
        str(e.get("gpu", "?")),
        f"{e.get('sm_count', '?')} SMs",
        f"L2 {_mib(int(e.get('l2_bytes', 0)))}",
        f"{int(e.get('memory_bytes', 0)) / 2**30:.0f} GiB",
        f"torch {e.get('torch', '?')}",
        f"CUDA {e.get('cuda', '?')}",
    ]
    if e.get("driver"):
        parts.append(f"driver {e['driver']}")
    parts.append(f"copy {report.copy_gbps:,.0f} GB/s")
    parts.append(f"group {report.group}")
    if e.get("date_utc"):
        parts.append(f"{e['date_utc']} UTC")
    return ", ".join(parts)


def _us(r: Result | None) -> str:
    if r is None:
        return ""
    if r.status == FAIL:
        return "FAIL"
    if not r.passed:
        return "n/a"
    return f"{r.median_us:,.2f}"


_SHAPE_COLUMNS = (("K x N", "right"), ("layers", "left"), ("weights", "left"), ("per model", "right"),
                  ("run per token", "right"))


def _shape_rows(report: Report) -> list[tuple[str, str, str, str, str]]:
    """Per shape: K x N, the layers that have it, int4 or fp16, how many per model and per token."""
    model = report.model
    rows = []
    for s in report.shapes:
        tok = ""
        if model is not None and s.linears:
            per_token = sum(executions(lin, 1, [1], model.num_experts, model.experts_per_token)[0] for lin in s.linears)
            tok = f"{per_token:g}"
        rows.append((s.label, s.names or "(--shape)", "int4" if s.quantized else "fp16", str(s.per_model or ""), tok))
    return rows


def _shapes_title(report: Report) -> str:
    model = report.model
    return "Linear layers" + (f" of {model.model}" if model and model.model else "")


# ---- Rich ----


def shapes_table(report: Report) -> Table:
    t = Table(title=_shapes_title(report), title_justify="left")
    for col, justify in _SHAPE_COLUMNS:
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in _shape_rows(report):
        t.add_row(*(Text(cell) for cell in row))
    return t


def results_table(report: Report) -> Table:
    t = Table(title=header(report), title_justify="left", caption=_caption(), caption_justify="left")
    for col, justify in (("K x N", "left"), ("M", "right"), ("kernel", "left"), ("check", "left"),
                         ("median µs", "right"), ("spread", "right"), ("GB/s", "right"), ("% copy", "right"),
                         ("vs fp16", "left")):
        t.add_column(col, justify=justify, no_wrap=col != "K x N", max_width=24 if col == "K x N" else None,
                     overflow="fold")  # type: ignore[arg-type]
    for shape in report.shapes:
        rows: list[tuple[int | None, Result]] = []
        dq = report.get(shape.k, shape.n, None, cases.W4_DEQUANT)
        if dq is not None:
            rows.append((None, dq))
        for m in report.batches:
            for method in cases.LAYER_METHODS:
                r = report.get(shape.k, shape.n, m, method)
                if r is not None:
                    rows.append((m, r))
        last_m: object = object()
        first_col = [shape.label]
        if shape.linears:
            first_col.append(f"{shape.names}")
            first_col.append(f"{shape.per_model}/model")
        for i, (m, r) in enumerate(rows):
            fp16 = report.get(shape.k, shape.n, m, cases.FP16) if m is not None else None
            t.add_row(
                Text(first_col[i], style="bold" if i == 0 else "dim") if i < len(first_col) else "",
                ("" if m == last_m else ("-" if m is None else str(m))),
                cases.label(r.method),
                _check_text(r),
                _us(r) if r.status != FAIL else "",
                f"{100 * r.spread:.1f}%" if r.passed and r.spread is not None else "",
                f"{r.gbps:,.0f}" if r.passed else "",
                f"{r.pct_of_copy:.0f}%" if r.passed and r.pct_of_copy is not None else "",
                _speedup_text(fp16, r) if r.method != cases.FP16 and m is not None else "",
                end_section=(i == len(rows) - 1),
            )
            last_m = m
    return t


def _check_text(r: Result) -> Text:
    if r.status == PASS:
        mark = Text("pass", style="green")
        if r.note:
            mark.append(" *", style="yellow")
        return mark
    if r.status == FAIL:
        return Text("FAIL", style="bold red")
    return Text("skip", style="dim")  # the reason is in the notes


def _speedup_text(base: Result | None, r: Result) -> Text:
    x = speedup(base, r)
    if x is None:
        return Text("")
    return Text(f"{x:5.2f}x ", style="green" if x >= 1 else "red").append(bar(x), style="green" if x >= 1 else "red")


def _caption() -> str:
    return ("GB/s counts the bytes of each format (docs/bench.md): fp16 K*N*2, int4 K*N/2 + scales + zeros, plus "
            "activations and output; % copy is of the copy bandwidth measured in this run. * see notes.")


def summary_table(report: Report) -> Table | None:
    rows = project(report)
    if not rows:
        return None
    t = Table(title="One decode step, all linear layers (sum of per-layer median x calls per step)", title_justify="left")
    for col in ("M", "fp16 ms", "w4 GEMV ms", "vs fp16", "w4 best ms", "vs fp16", "torch int4 ms", "vs fp16"):
        t.add_column(col, justify="right" if "vs" not in col else "left", no_wrap=True)
    for row in rows:
        t.add_row(
            str(row["m"]),
            _ms(row[f"{cases.FP16}_us"]),
            _ms(row[f"{cases.W4_GEMV}_us"]),
            _x(row[f"{cases.W4_GEMV}_speedup"]),
            _ms(row[f"{W4_BEST}_us"]),
            _x(row[f"{W4_BEST}_speedup"]),
            _ms(row[f"{cases.TORCH_INT4}_us"]),
            _x(row[f"{cases.TORCH_INT4}_speedup"]),
        )
    return t


def _ms(us: float | None) -> str:
    return "n/a" if us is None else f"{us / 1000:,.3f}"


def step_rows(report: Report) -> list[dict[str, Any]]:
    """Per M, the decode step as one graph (w4cli/bench/step.py): fp16 and w4 ms, the ratio, w4's
    tokens per second, w4's per-shape sum beside it, w4's % of the copy rate over the step's bytes,
    and the seam: the step's time minus its bytes at the copy rate."""
    by = {(r.m, r.method): r for r in report.steps}
    sums = {row["m"]: row for row in project(report)}
    rows = []
    for m in report.batches:
        fp, w4, w4p = by.get((m, "fp16")), by.get((m, "w4")), by.get((m, "w4_pdl"))
        if fp is None and w4 is None:
            continue
        fp_us = fp.step_us if fp else None
        w4_us = w4.step_us if w4 else None
        pdl_us = w4p.step_us if w4p else None
        bytes_us = w4.bytes_per_step / (report.copy_gbps * 1e3) if w4 is not None and report.copy_gbps else None
        rows.append({
            "m": m,
            "fp16_us": fp_us,
            "w4_us": w4_us,
            "speedup": fp_us / w4_us if fp_us and w4_us else None,
            "w4_tokens_per_s": m / (w4_us * 1e-6) if w4_us else None,
            "w4_per_shape_sum_us": sums.get(m, {}).get(f"{cases.W4_GEMV}_us"),
            "fp16_per_shape_sum_us": sums.get(m, {}).get(f"{cases.FP16}_us"),
            "w4_pct_of_copy": 100.0 * bytes_us / w4_us if bytes_us and w4_us else None,
            "w4_seam_us": w4_us - bytes_us if bytes_us is not None and w4_us else None,
            "w4_pdl_us": pdl_us,
            "w4_pdl_speedup": fp_us / pdl_us if fp_us and pdl_us else None,
            "w4_pdl_seam_us": pdl_us - bytes_us if bytes_us is not None and pdl_us else None,
            "layers_measured": w4.layers_measured if w4 else (fp.layers_measured if fp else 0),
            "layers_total": w4.layers_total if w4 else (fp.layers_total if fp else 0),
        })
    return rows


def step_table(report: Report) -> Table | None:
    rows = step_rows(report)
    if not rows:
        return None
    t = Table(title="One decode step as one CUDA graph: every linear layer in order, each with its own weights",
              title_justify="left")
    for col in ("M", "fp16 ms", "w4 ms", "vs fp16", "w4 tokens/s", "w4 per-shape sum ms", "w4 % of copy", "w4 seam ms",
                "w4 PDL ms", "vs fp16", "w4 PDL seam ms"):
        t.add_column(col, justify="right" if "vs" not in col else "left", no_wrap=True)
    for row in rows:
        t.add_row(str(row["m"]), _ms(row["fp16_us"]), _ms(row["w4_us"]), _x(row["speedup"]), _tps(row["w4_tokens_per_s"]),
                  _ms(row["w4_per_shape_sum_us"]), _pct(row["w4_pct_of_copy"]), _ms(row["w4_seam_us"]),
                  _ms(row["w4_pdl_us"]), _x(row["w4_pdl_speedup"]), _ms(row["w4_pdl_seam_us"]))
    return t


def kind_rows(report: Report) -> list[dict[str, Any]]:
    """Where the decode step goes, per M and layer kind (w4cli/bench/step.py KindTime): fp16 and
    w4 (with PDL) ms for the kind's layers alone, each method's share of its kinds' total, its %
    of the copy rate over the kind's bytes, and the ratio; the kinds' total closes each M."""
    by = {(r.m, r.method): r for r in report.steps}
    rows = []
    for m in report.batches:
        fp, w4 = by.get((m, "fp16")), by.get((m, "w4_pdl"))
        if fp is None or w4 is None or not fp.kinds or not w4.kinds:
            continue
        fp_total, w4_total = sum(k.us for k in fp.kinds), sum(k.us for k in w4.kinds)
        for f, w in [*zip(fp.kinds, w4.kinds), (None, None)]:
            name = f.name if f else "all kinds"
            fp_us, w4_us = (f.us, w.us) if f else (fp_total, w4_total)
            fp_bytes, w4_bytes = (f.bytes, w.bytes) if f else (sum(k.bytes for k in fp.kinds), sum(k.bytes for k in w4.kinds))
            rows.append({
                "m": m,
                "kind": name,
                "fp16_us": fp_us,
                "fp16_share": 100.0 * fp_us / fp_total if fp_total else None,
                "fp16_pct_of_copy": _pct_of_copy(fp_bytes, fp_us, report.copy_gbps),
                "w4_us": w4_us,
                "w4_share": 100.0 * w4_us / w4_total if w4_total else None,
                "w4_pct_of_copy": _pct_of_copy(w4_bytes, w4_us, report.copy_gbps),
                "speedup": fp_us / w4_us if w4_us else None,
            })
    return rows


def _pct_of_copy(nbytes: int, us: float, copy_gbps: float | None) -> float | None:
    return 100.0 * nbytes / (us * 1e3) / copy_gbps if us and copy_gbps else None


_KIND_COLUMNS = ("M", "layer kind", "fp16 ms", "share", "% of copy", "w4 PDL ms", "share", "% of copy", "vs fp16")


def _kind_cells(row: dict[str, Any]) -> list[Any]:
    return [str(row["m"]), row["kind"], _ms(row["fp16_us"]), _pct(row["fp16_share"]), _pct(row["fp16_pct_of_copy"]),
            _ms(row["w4_us"]), _pct(row["w4_share"]), _pct(row["w4_pct_of_copy"])]


def kind_table(report: Report) -> Table | None:
    rows = kind_rows(report)
    if not rows:
        return None
    t = Table(title="Where the decode step goes: each layer kind's layers alone, one graph per kind", title_justify="left")
    for col in _KIND_COLUMNS:
        t.add_column(col, justify="left" if col in ("layer kind", "vs fp16") else "right", no_wrap=True)
    for row in rows:
        t.add_row(*_kind_cells(row), _x(row["speedup"]), end_section=row["kind"] == "all kinds")
    return t


def _tps(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}%"


def _x(x: float | None) -> Text:
    if x is None:
        return Text("n/a")
    return Text(f"{x:4.2f}x ", style="green" if x >= 1 else "red").append(bar(x), style="green" if x >= 1 else "red")


def notes(report: Report) -> list[str]:
    """Model notes, run notes, and every non-pass or flagged result, one line each."""
    lines = list(report.model.notes) if report.model else []
    lines += report.notes
    if report.model is not None:
        lines.append("w4 best = per layer, the faster of w4 GEMV and w4 dequant+mm")
    skipped: dict[tuple[str, str], list[str]] = {}
    for r in report.results:
        if not r.note:
            continue
        if r.status == SKIPPED:  # once per kernel and reason, listing the shapes
            where = skipped.setdefault((r.method, r.note), [])
            if f"{r.k}x{r.n}" not in where:
                where.append(f"{r.k}x{r.n}")
            continue
        where = f"{cases.label(r.method)} {r.k}x{r.n}" + (f" M={r.m}" if r.m is not None else "")
        lines.append(f"{where}: FAIL: {r.note}" if r.status == FAIL else f"{where}: {r.note}")
    for (method, note), where in skipped.items():
        lines.append(f"{cases.label(method)} skipped ({', '.join(where)}): {note}")
    for note in dict.fromkeys(f"decode step {r.method}: {r.note}" for r in report.steps if r.note):
        lines.append(note)
    if report.steps:
        lines.append("decode step as one graph: the linear layers only (no attention, norms or sampling; where a fused "
                     "gate_up_proj feeds down_proj, a copy of half its output stands in for the activation); "
                     "seam = step time minus the step's bytes at the copy rate")
    if kind_rows(report):
        lines.append("where the step goes: a kind's time is its layers alone, back to back in one graph, so the "
                     "kinds' total leaves out the seams between different kinds")
    return lines


# ---- markdown ----


def markdown(report: Report) -> str:
    """Tables ready for docs/performance.md: per shape and M, the dequantize kernel, the decode-step summary."""
    out = [f"{header(report)}.", ""]
    if report.environment.get("command"):
        out += [f"Command: `{report.environment['command']}`", ""]
    out += [
        "| K x N | layers | M | fp16 cuBLAS us | w4 GEMV us | w4 GEMV GB/s (% of copy) | w4 GEMV vs fp16 | "
        "w4 dequant+mm us | torch int4 us | torch int4 vs fp16 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in report.shapes:
        for m in report.batches:
            g = lambda method: report.get(shape.k, shape.n, m, method)  # noqa: E731
            fp16, w4, dq, i4 = g(cases.FP16), g(cases.W4_GEMV), g(cases.W4_DQ_MM), g(cases.TORCH_INT4)
            bw = f"{w4.gbps:,.0f} ({w4.pct_of_copy:.0f}%)" if w4 is not None and w4.passed and w4.pct_of_copy is not None else ""
            out.append(
                f"| {shape.label} | {shape.names or '-'} | {m} | {_us(fp16)} | {_us(w4)} | {bw} | {_mx(speedup(fp16, w4))} | "
                f"{_us(dq)} | {_us(i4)} | {_mx(speedup(fp16, i4))} |"
            )
    dq_rows = [report.get(s.k, s.n, None, cases.W4_DEQUANT) for s in report.shapes]
    if any(r is not None for r in dq_rows):
        out += ["", "| K x N | w4 dequantize us | GB/s | % of copy |", "|---|---|---|---|"]
        for s, r in zip(report.shapes, dq_rows):
            if r is None:
                continue
            gb = f"{r.gbps:,.0f}" if r.passed else ""
            pct = f"{r.pct_of_copy:.0f}%" if r.passed and r.pct_of_copy is not None else ""
            out.append(f"| {s.label} | {_us(r)} | {gb} | {pct} |")
    rows = project(report)
    if rows:
        name = report.model.model if report.model else ""
        out += ["", f"One decode step of {name}, all linear layers (ms):", "",
                "| M | fp16 | w4 GEMV | vs fp16 | w4 best | vs fp16 | torch int4 | vs fp16 |", "|---|---|---|---|---|---|---|---|"]
        for row in rows:
            out.append(
                f"| {row['m']} | {_ms(row[f'{cases.FP16}_us'])} | {_ms(row[f'{cases.W4_GEMV}_us'])} | "
                f"{_mx(row[f'{cases.W4_GEMV}_speedup'])} | {_ms(row[f'{W4_BEST}_us'])} | {_mx(row[f'{W4_BEST}_speedup'])} | "
                f"{_ms(row[f'{cases.TORCH_INT4}_us'])} | {_mx(row[f'{cases.TORCH_INT4}_speedup'])} |"
            )
    srows = step_rows(report)
    if srows:
        name = report.model.model if report.model else ""
        out += ["", f"One decode step of {name} as one CUDA graph, every linear layer in order (ms):", "",
                "| M | fp16 | w4 | vs fp16 | w4 tokens/s | w4 per-shape sum | w4 % of copy | w4 seam | w4 PDL | vs fp16 | w4 PDL seam |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in srows:
            out.append(f"| {row['m']} | {_ms(row['fp16_us'])} | {_ms(row['w4_us'])} | {_mx(row['speedup'])} | "
                       f"{_tps(row['w4_tokens_per_s'])} | {_ms(row['w4_per_shape_sum_us'])} | {_pct(row['w4_pct_of_copy'])} | "
                       f"{_ms(row['w4_seam_us'])} | {_ms(row['w4_pdl_us'])} | {_mx(row['w4_pdl_speedup'])} | "
                       f"{_ms(row['w4_pdl_seam_us'])} |")
    krows = kind_rows(report)
    if krows:
        out += ["", "Where the decode step goes: each layer kind's layers alone, one graph per kind (ms):", "",
                _md_row(_KIND_COLUMNS), _md_row("---" for _ in _KIND_COLUMNS)]
        out += [_md_row([*_kind_cells(row), _mx(row["speedup"])]) for row in krows]
    out += ["", "Bytes counted (GB/s = bytes / median): fp16 K*N*2; w4 K*N/2 + (K/G)*N*2 + (K/G)*N/2; torch int4 "
            "K*N/2 + (K/G)*N*4; each plus M*K*2 + M*N*2; dequantize K*N/2 + (K/G)*N*5/2 + K*N*2. "
            "FAIL = output did not match the reference (no time shown); n/a = not run here."]
    lines = notes(report)
    if lines:
        out += [""] + [f"- {line}" for line in lines]
    return "\n".join(out) + "\n"


def shapes_markdown(report: Report) -> str:
    """The shapes a run would measure (`w4 bench --dry-run --markdown`), as a markdown table."""
    out = [f"{_shapes_title(report)}:", "", _md_row(col for col, _ in _SHAPE_COLUMNS),
           _md_row("---:" if justify == "right" else "---" for _, justify in _SHAPE_COLUMNS)]
    out += [_md_row(row) for row in _shape_rows(report)]
    lines = notes(report)
    if lines:
        out += [""] + [f"- {line}" for line in lines]
    return "\n".join(out) + "\n"


def _md_row(cells) -> str:
    # a `|` inside a cell would end it
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"


def _mx(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x"


# ---- JSON ----


def to_json(report: Report) -> dict[str, Any]:
    """Every number, the environment and the byte definitions, in one document."""
    model = report.model
    return {
        "w4_bench": JSON_VERSION,
        "ok": not report.failures,
        "failures": len(report.failures),
        "environment": report.environment,
        "copy": {"gbps": report.copy_gbps, "name": report.copy_name},
        "group_size": report.group,
        "batches": report.batches,
        "bytes_definition": cases.DEFINITION,
        "model": None if model is None else {
            "model": model.model,
            "model_type": model.model_type,
            "num_hidden_layers": model.num_hidden_layers,
            "num_experts": model.num_experts,
            "experts_per_token": model.experts_per_token,
        },
        "shapes": [
            {
                "k": s.k, "n": s.n, "quantized": s.quantized, "per_model": s.per_model,
                "layers": [{"name": lin.name, "kind": lin.kind, "per_layer": lin.per_layer, "layers": lin.layers,
                            "per_model": lin.per_model, "active_per_layer": lin.active} for lin in s.linears],
            }
            for s in report.shapes
        ],
        "results": [r.to_dict() for r in report.results],
        "summary": project(report),
        "decode_step": {"results": [r.to_dict() for r in report.steps], "rows": step_rows(report),
                        "kinds": kind_rows(report)},
        "notes": notes(report),
    }

"""Check rows and what becomes of them: a Rich table, a JSON document, JUnit XML, an exit code.

A check is PASS, FAIL, SKIP (could not look here, allowed) or ERROR (could not look and the caller
said it must: `--require-gpu`). Only an all-PASS/SKIP report exits 0.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from w4cli.gpu.checks import Mismatch
from w4cli.errors import CheckFailed, EnvironmentUnavailable, W4Error

PASS, FAIL, SKIP, ERROR = "PASS", "FAIL", "SKIP", "ERROR"
STYLES = {PASS: "green", FAIL: "bold red", SKIP: "yellow", ERROR: "bold red"}


@dataclass
class Check:
    name: str
    compared: str  # what was compared with what, in words
    status: str = PASS
    detail: str = ""
    group: str = ""  # selftest | integrity | compare: the JUnit classname
    needs_gpu: bool = False
    seconds: float = 0.0


@dataclass
class Report:
    title: str
    target: dict[str, Any]
    environment: dict[str, Any]
    checks: list[Check] = field(default_factory=list)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.status == status)

    def summary(self) -> dict[str, int]:
        return {"checks": len(self.checks), "passed": self.count(PASS), "failed": self.count(FAIL),
                "skipped": self.count(SKIP), "errors": self.count(ERROR)}


def run_check(report: Report, name: str, compared: str, body: Callable[[], str], group: str, needs_gpu: bool = False) -> Check:
    """Run one check. `body` returns the PASS detail or raises Mismatch (FAIL). Any other error is a
    FAIL too, with its one-line message: a check that could not finish never passes."""
    start = time.perf_counter()
    try:
        detail, status = body(), PASS
    except Mismatch as exc:
        detail, status = str(exc), FAIL
    except W4Error as exc:
        detail, status = str(exc), FAIL
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure, never as a traceback
        detail, status = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", FAIL
    return report.add(Check(name, compared, status, detail, group, needs_gpu, time.perf_counter() - start))


def skip(report: Report, name: str, compared: str, reason: str, group: str, require_gpu: bool) -> Check:
    """A GPU check that cannot run here: SKIP, or ERROR when --require-gpu says it must run."""
    status = ERROR if require_gpu else SKIP
    detail = f"{reason} (--require-gpu)" if require_gpu else reason
    return report.add(Check(name, compared, status, detail, group, needs_gpu=True))


def raise_for_outcome(report: Report) -> None:
    """Exit code: 1 if any check failed, else 3 if a required check could not run, else 0."""
    failed = [c for c in report.checks if c.status == FAIL]
    if failed:
        first = failed[0]
        raise CheckFailed(f"{len(failed)} of {len(report.checks)} checks failed; first: {first.name}: {first.detail}")
    errors = [c for c in report.checks if c.status == ERROR]
    if errors:
        raise EnvironmentUnavailable(f"{len(errors)} GPU checks could not run: {errors[0].detail}")


FOLDED = {SKIP: "skipped", ERROR: "could not run"}


def fold_gpu_rows(checks: list[Check]) -> tuple[list[Check], list[str]]:
    """GPU checks that did not run all say why in the same words: the table shows the others, and
    one line per (result, reason) says how many were left out. JSON and JUnit keep every check."""
    shown, folded = [], {}
    for c in checks:
        if c.needs_gpu and c.status in FOLDED:
            folded.setdefault((c.status, c.detail), []).append(c)
        else:
            shown.append(c)
    lines = [f"{len(rows)} GPU check{'s' if len(rows) != 1 else ''} {FOLDED[status]}: {reason}" for (status, reason), rows in folded.items()]
    return shown, lines


def render_table(report: Report, console) -> None:
    from rich.table import Table
    from rich.text import Text

    s = report.summary()
    caption = f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped" + (f", {s['errors']} errors" if s["errors"] else "")
    table = Table(title=report.title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column("check", style="bold", overflow="fold")
    table.add_column("compared", overflow="fold")
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold")
    shown, folded = fold_gpu_rows(report.checks)
    for c in shown:
        # Text, not markup: details quote tensor names and [index] lists
        table.add_row(Text(c.name), Text(c.compared), Text(c.status, style=STYLES[c.status]), Text(c.detail))
    console.print(table)
    for line in folded:
        console.print(line, markup=False, highlight=False)


def to_document(report: Report) -> dict[str, Any]:
    return {
        "title": report.title,
        "target": report.target,
        "environment": report.environment,
        "summary": report.summary(),
        "checks": [{**asdict(c), "seconds": round(c.seconds, 4)} for c in report.checks],
    }


def junit_tree(report: Report) -> ET.ElementTree:
    s = report.summary()
    total = sum(c.seconds for c in report.checks)
    suites = ET.Element("testsuites", name="w4 verify", tests=str(s["checks"]), failures=str(s["failed"]),
                        errors=str(s["errors"]), skipped=str(s["skipped"]), time=f"{total:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=report.title, tests=str(s["checks"]), failures=str(s["failed"]),
                          errors=str(s["errors"]), skipped=str(s["skipped"]), time=f"{total:.3f}")
    props = ET.SubElement(suite, "properties")
    for key, value in report.environment.items():
        ET.SubElement(props, "property", name=str(key), value=str(value))
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname=f"w4.verify.{c.group or 'check'}", name=c.name, time=f"{c.seconds:.3f}")
        if c.status == FAIL:
            ET.SubElement(case, "failure", message=c.detail, type="mismatch").text = f"{c.compared}\n{c.detail}"
        elif c.status == ERROR:
            ET.SubElement(case, "error", message=c.detail, type="environment").text = c.detail
        elif c.status == SKIP:
            ET.SubElement(case, "skipped", message=c.detail)
        elif c.detail:
            ET.SubElement(case, "system-out").text = c.detail
    ET.indent(suites)
    return ET.ElementTree(suites)


def write_junit(report: Report, path: Path) -> None:
    junit_tree(report).write(path, encoding="utf-8", xml_declaration=True)

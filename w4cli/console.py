"""Where output goes: Rich (tables for people, progress) and JSON (for machines), and the one
error boundary every command runs inside.

Results go to stdout; progress, messages and errors go to stderr, so `w4 ... --json - | jq` works.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from w4cli.errors import EXIT_FAILED, EXIT_INTERRUPTED, W4Error

DEBUG_ENV = "W4_DEBUG"

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


# What a file, directory or tensor name must not carry onto a terminal: C0 and C1 controls and
# DEL (a newline would forge a second `error:` line, ESC recolour or move the cursor), the Unicode
# line and paragraph separators, the bidirectional overrides that reorder what is shown, and lone
# surrogates (undecodable bytes in a file name) that no UTF-8 stream can encode.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str) -> str:
    """`text` with every character that could act on a terminal written as a Python escape."""
    return _UNPRINTABLE.sub(_escape, text)


def error_line(message: str) -> None:
    # markup off: messages quote file and tensor names that may contain [brackets]
    stderr.print(f"error: {printable(message)}", style="bold red", markup=False, highlight=False)


def note(message: str) -> None:
    stderr.print(printable(message), markup=False, highlight=False)


class _Run:
    """What the running command was asked for and has done, for the JSON document of a failure."""

    def __init__(self, json_to: str | Path | None) -> None:
        self.json_to = json_to  # "-" for stdout, a FILE, or None without --json
        self.json_written = False
        self.done: dict[str, Any] = {}


_run = _Run(None)


def record(**facts: Any) -> None:
    """Note what the command has done so far; a failure's JSON document reports it under `done`."""
    _run.done.update(facts)


def emit_json(document: Any, path: str | Path = "-") -> None:
    """One machine-readable document: on stdout when `path` is '-', else in the file `path`."""
    text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        Path(path).write_text(text, encoding="utf-8")
    _run.json_written = True


def _emit_failure(command: str, message: str, exit_code: int) -> None:
    """The failure as the one JSON document --json promised, unless the command already wrote its
    own (a check that failed is reported in the command's document, with every result)."""
    if _run.json_to is None or _run.json_written:
        return
    document = {"command": command, "ok": False, "error": message, "exit_code": exit_code, "done": _run.done}
    try:
        emit_json(document, _run.json_to)
    except OSError:
        pass  # the error line on stderr still says what failed; FILE is what could not be written


def boundary(command: F) -> F:
    """Run a command so that every failure is one line on stderr and a documented exit code.

    W4Error carries its own code; Ctrl-C is 130 (cleanup happens in the code that owns the
    half-written state); anything else is a bug: one line, exit 1, traceback with W4_DEBUG=1.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        global _run
        _run = _Run(kwargs.get("json_file"))  # every command's --json FILE (options.JsonOpt)
        try:
            return command(*args, **kwargs)
        except typer.Exit:
            raise
        except W4Error as exc:
            if debug_enabled():
                traceback.print_exc()
            message, code = str(exc), exc.exit_code
        except KeyboardInterrupt:
            message, code = "interrupted", EXIT_INTERRUPTED
        except Exception as exc:  # noqa: BLE001 - the one place that turns bugs into a line
            if debug_enabled():
                traceback.print_exc()
            message, code = f"internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback)", EXIT_FAILED
        error_line(message)
        _emit_failure(command.__name__, message, code)
        raise typer.Exit(code) from None

    return run  # type: ignore[return-value]


def result(document: Any, json_file: Path | None, show: Callable[[], None]) -> None:
    """A command's result, the same way in every command: `show()` prints it for people on stdout;
    `--json FILE` also writes `document` to FILE, and `--json -` prints it on stdout instead."""
    if json_file is None or str(json_file) != "-":
        show()
    if json_file is not None:
        emit_json(document, json_file)
        if str(json_file) != "-":
            note(f"wrote {json_file}")


def summary_table(title: str, fields: dict[str, Any]) -> None:
    """A conversion's result for people: a two-column table, each number with its unit (the JSON
    keys name the unit instead); lists and dicts are left to the JSON document."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in fields.items():
        if isinstance(value, (list, dict)):
            continue
        label, text = _with_unit(key, value)
        table.add_row(Text(printable(label)), Text(printable(text)))
    stdout.print(table)


def _with_unit(key: str, value: Any) -> tuple[str, str]:
    """(label, value) of a summary row: `bytes_*` in MB, `*seconds` in s, `mb_per_s` in MB/s."""
    if key.startswith("bytes") and isinstance(value, (int, float)):
        return key.replace("_", " "), f"{value / 1e6:,.1f} MB"
    if key.endswith("seconds") and isinstance(value, (int, float)):
        label = key.removesuffix("seconds").rstrip("_") or "total"
        return f"{label} time", f"{value:,.3f} s"
    if key == "mb_per_s":
        return "throughput", f"{value:,.1f} MB/s"
    return key.replace("_", " "), str(value)


# without a terminal (CI logs, pipes) a bar cannot redraw: a counted run prints a plain line as each
# tenth of its steps is done, at most one line this often (and its last step once it printed any),
# so a quick run prints none
STEP_LINE_SECONDS = 5.0


@contextmanager
def steps(description: str, total: int | None) -> Iterator[Callable[..., None]]:
    """A counting progress bar on stderr; yields `advance(label="")`: one step done, `label` names
    the next. total None: a count without a bar end."""
    if not stderr.is_terminal:
        yield _step_lines(description, total)
        return
    from rich.progress import MofNCompleteColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[label]}"), TimeElapsedColumn(), console=stderr, transient=True)
    with progress:
        task = progress.add_task(description, total=total, label="")
        yield lambda label="": progress.update(task, advance=1, label=label)


def _step_lines(description: str, total: int | None) -> Callable[..., None]:
    start = last = time.monotonic()
    done = tenths = 0

    def advance(label: str = "") -> None:
        nonlocal done, tenths, last
        done += 1
        now = time.monotonic()
        reached = done * 10 // total if total else 0
        if reached > tenths and (now - last >= STEP_LINE_SECONDS or (done == total and tenths > 0)):
            tenths, last = reached, now
            note(f"{description}: {done}/{total} after {now - start:.0f} s {label}".rstrip())

    return advance


@contextmanager
def byte_progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A Rich progress bar in bytes on stderr; yields `advance(nbytes)`."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    )
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda nbytes: progress.advance(task, nbytes)

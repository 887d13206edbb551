"""Where output goes: Rich (tables for people, progress) and JSON (for machines), and the one
error boundary every command runs inside.

Results go to stdout; progress, messages and errors go to stderr, so `w4 ... --json | jq` works.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def error_line(message: str) -> None:
    # markup off: messages quote file and tensor names that may contain [brackets]
    stderr.print(f"error: {message}", style="bold red", markup=False, highlight=False)


def note(message: str) -> None:
    stderr.print(message, markup=False, highlight=False)


def emit_json(document: Any) -> None:
    """One machine-readable document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def boundary(command: F) -> F:
    """Run a command so that every failure is one line on stderr and a documented exit code.

    W4Error carries its own code; Ctrl-C is 130 (cleanup happens in the code that owns the
    half-written state); anything else is a bug: one line, exit 1, traceback with W4_DEBUG=1.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except typer.Exit:
            raise
        except W4Error as exc:
            if debug_enabled():
                traceback.print_exc()
            error_line(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            error_line("interrupted; nothing was left half-written")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:  # noqa: BLE001 - the one place that turns bugs into a line
            if debug_enabled():
                traceback.print_exc()
            error_line(f"internal error: {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback)")
            raise typer.Exit(EXIT_FAILED) from None

    return run  # type: ignore[return-value]


def summary(title: str, fields: dict[str, Any], as_json: bool) -> None:
    """A command's result: one JSON document, or a two-column table for people. Keys ending in
    `bytes...` print in MB."""
    if as_json:
        emit_json(fields)
        return
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in fields.items():
        if isinstance(value, list):
            continue
        text = f"{value / 1e6:,.1f} MB" if key.startswith("bytes") else str(value)
        table.add_row(key.replace("_", " "), text)
    stdout.print(table)


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

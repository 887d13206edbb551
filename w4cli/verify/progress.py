"""A counting progress bar on stderr (results stay alone on stdout)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from w4cli.console import stderr


@contextmanager
def steps(description: str, total: int) -> Iterator[Callable[[str], None]]:
    """Yields `advance(label)`: one step done, `label` names the next."""
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[label]}"), TimeElapsedColumn(), console=stderr, transient=True)
    with progress:
        task = progress.add_task(description, total=total, label="")
        yield lambda label="": progress.update(task, advance=1, label=label)

"""OUTPUT_DIR for one run of a command that writes a checkpoint.

Before any work it is refused if becoming w4's output could lose anything, locked against other w4
runs, and its temporary sibling is created, so a path that cannot be written is found then and not
after the conversion. The output is written into the sibling and put in place by a rename that
never replaces what was not checked.

Beside OUTPUT_DIR, all matched by `*.w4tmp-*`:
  OUT.w4tmp-lock            locked by the run writing OUT, from its start to its end; holds its pid
  OUT.w4tmp-<pid>-<hex>     the output being written; after a --force swap, the previous OUT being
                            removed (`-old` added where the filesystem cannot swap)
A run removes those whose process is gone: what a killed run or an interrupted removal left.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING

from w4cli.write import signals
from w4cli.errors import InputRefused, Interrupted, OutputFailed, W4Error
from w4cli.read.hub import CHECKPOINT_PATTERNS, CODE_PATTERNS
from w4cli.write.rename import exchange, rename_noreplace

if TYPE_CHECKING:
    import typer

    from w4cli.read.layers import QuantModel

TEMP_MARK = ".w4tmp-"
LOCK = "lock"
# what --force may delete: the files a conversion reads, writes or copies (the model card and
# licence files among them); *.py files too when the directory's shards record that w4 wrote it
# with --include-code (w4cli/write/provenance.py), else a *.py may be someone's work
CHECKPOINT_FILES = CHECKPOINT_PATTERNS
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
SHOWN = 5  # names a refusal lists


def check_output_dir(output: Path, inputs: Iterable[Path]) -> None:
    """Refuse, before anything is created, an OUTPUT_DIR that is the root or home directory, is or
    holds the current directory, overlaps an input, is a mount point, a file or a dangling link."""
    try:
        _check_output_path(output, inputs)
    except OSError as exc:
        raise cannot_write(output, exc) from None


def _check_output_path(output: Path, inputs: Iterable[Path]) -> None:
    if output.is_symlink() and not output.exists():
        raise InputRefused(f"OUTPUT_DIR {output} is a symbolic link to {os.readlink(output)}, which does not exist")
    target = output.resolve()
    cwd = Path.cwd().resolve()
    if target == Path(target.anchor):
        raise InputRefused(f"OUTPUT_DIR {output} is the root directory: w4 never replaces it")
    if target == cwd or target in cwd.parents:
        raise InputRefused(f"OUTPUT_DIR {output} is or contains the current directory: w4 never replaces it")
    if target == Path.home().resolve():
        raise InputRefused(f"OUTPUT_DIR {output} is the home directory: w4 never replaces it")
    for source in inputs:
        source = source.resolve()
        if target == source or source in target.parents:
            raise InputRefused(f"OUTPUT_DIR {output} is inside the input checkpoint {source}")
        if target in source.parents:
            raise InputRefused(f"OUTPUT_DIR {output} contains the input checkpoint {source}")
    if target.exists():
        if not target.is_dir():
            raise InputRefused(f"OUTPUT_DIR {output} exists and is not a directory")
        if os.path.ismount(target):
            raise InputRefused(f"OUTPUT_DIR {output} is a mount point, which a rename cannot replace: give a directory inside it")


def open_for_conversion(
    ctx: typer.Context,
    model: str,
    output_dir: Path,
    force: bool,
    revision: str | None,
    token: str | None,
    cache_dir: Path | None,
    include_code: bool = False,
) -> tuple[QuantModel, OutputDirectory, dict[str, str]]:
    """The front half of every command that writes a checkpoint: claim OUTPUT_DIR before any
    download (refusals, the lock, the temporary sibling), resolve MODEL, refuse an OUTPUT_DIR
    inside the snapshot, open and validate. OUTPUT_DIR stays claimed until the command `ctx`
    runs ends, whatever ends it: the context releases its resources then. Also returns where the
    output comes from (provenance.py), for its shards' metadata and the summary."""
    from w4cli.read.source import open_quantized, resolve
    from w4cli.write import provenance

    check_output_dir(output_dir, [Path(model)] if Path(model).is_dir() else [])
    output = ctx.with_resource(OutputDirectory(output_dir, force))
    snapshot = resolve(model, revision, token, cache_dir, include_code)
    check_output_dir(output_dir, [snapshot.path])
    return open_quantized(snapshot.path), output, provenance.record(ctx, snapshot)


def cannot_write(output: Path, exc: OSError) -> W4Error:
    """The message for an OSError met while creating or writing OUTPUT_DIR."""
    if exc.errno in NO_SPACE:
        return OutputFailed(f"{exc.strerror.lower()} while writing OUTPUT_DIR {output}")
    where = f" ({exc.filename})" if exc.filename else ""
    return InputRefused(f"OUTPUT_DIR {output} cannot be written: {exc.strerror}{where}")


def files_not_in_a_checkpoint(path: Path) -> list[str]:
    """What replacing `path` would lose besides a checkpoint: everything, unless it is a directory
    holding config.json and weights; else its entries that are not checkpoint files (a checkpoint
    holds no directories)."""
    if path.is_symlink() or not path.is_dir():
        return [path.name]
    entries = sorted(os.scandir(path), key=lambda entry: entry.name)
    names = {entry.name for entry in entries}
    is_checkpoint = "config.json" in names and any(fnmatchcase(name, "*.safetensors") for name in names)
    patterns = CHECKPOINT_FILES + (CODE_PATTERNS if is_checkpoint and _written_with_code(path) else [])
    lost = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            lost.append(f"{entry.name}/")
        elif not is_checkpoint or not any(fnmatchcase(entry.name, pattern) for pattern in patterns):
            lost.append(entry.name)
    return lost


def _written_with_code(path: Path) -> bool:
    from w4cli.write import provenance

    return provenance.made_with_code(provenance.read(path))


class OutputDirectory:
    """OUTPUT_DIR claimed for one run. Entering it checks, locks and creates the temporary sibling
    `temp`; commit() puts `temp` in place; leaving it removes `temp` unless committed and releases
    the lock."""

    def __init__(self, output: Path, force: bool):
        self.output = output  # as the user wrote it, for messages
        self.target = output.resolve()  # a link to a directory: the directory
        self.force = force
        self.temp = self._sibling(f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.previous: Path | None = None  # the replaced OUTPUT_DIR, swapped out and being removed
        self.committed = False
        self._lock: int | None = None
        self._made_parents: list[Path] = []

    def _sibling(self, suffix: str) -> Path:
        return self.target.parent / f"{self.target.name}{TEMP_MARK}{suffix}"

    def __enter__(self) -> OutputDirectory:
        try:
            # a stop request waits until the claim is whole, so it is never left half made
            with signals.held():
                self._make_parents()
                self._lock = _take_lock(self._sibling(LOCK), self.output)
                self._check_replaceable()
                self.temp.mkdir()
            # interruptible: what is left of the stale ones is removed by the next run
            _remove_stale_siblings(self.target)
        except BaseException as exc:
            self.__exit__()
            if isinstance(exc, OSError):
                raise cannot_write(self.output, exc) from None
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        # the run is ending either way: a stop request during the clean-up changes nothing, and
        # must not leave it half done
        with signals.held(redeliver=False):
            self._release()

    def _make_parents(self) -> None:
        missing = []
        parent = self.target.parent
        while not parent.exists() and parent != parent.parent:
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            self._made_parents.append(directory)

    def _check_replaceable(self) -> None:
        try:
            if not os.listdir(self.target):
                return
        except FileNotFoundError:
            return
        if not self.force:
            raise InputRefused(f"OUTPUT_DIR {self.output} is not empty (pass --force to replace it)")
        lost = files_not_in_a_checkpoint(self.target)
        if lost:
            raise InputRefused(
                f"--force replaces only an empty directory or a checkpoint (config.json, weights, tokenizer and "
                f"model card files), and replacing OUTPUT_DIR {self.output} would lose {_first_few(lost)}"
            )

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Around the writes into `temp` and the commit: a stop request or a full disk becomes one
        message that says what OUTPUT_DIR holds now."""
        try:
            yield
        except KeyboardInterrupt:
            raise Interrupted(self._interrupted()) from None
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise cannot_write(self.output, exc) from None
            raise

    def _interrupted(self) -> str:
        if not self.committed:
            return f"interrupted; OUTPUT_DIR {self.output} was not changed"
        if self.previous is not None and os.path.lexists(self.previous):
            return (
                f"interrupted while removing the previous OUTPUT_DIR {self.output}: the new one is complete, and "
                f"the next w4 run on it removes what is left of the old one ({self.previous.name})"
            )
        return f"interrupted after OUTPUT_DIR {self.output} was written: it is complete"

    def commit(self) -> None:
        """Put `temp` in place, replacing nothing that was not checked: without --force only an
        absent or empty OUTPUT_DIR; with it, a directory that is swapped out, checked again, and
        swapped back if it holds anything but a checkpoint. Then remove the swapped-out one."""
        # safetensors writes through a private temp file (mode 0600); give the files the mode any
        # other file the user creates would get
        mode = 0o666 & ~_umask()
        for path in self.temp.iterdir():
            path.chmod(mode)
            _fsync(path)
        _fsync(self.temp)
        # a stop request between the rename and its record would make the report lie
        with signals.held():
            self._place()
        _fsync(self.target.parent)
        if self.previous is not None:
            shutil.rmtree(self.previous, ignore_errors=True)

    def _place(self) -> None:
        try:
            os.rmdir(self.target)  # an empty directory loses nothing
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            if not self.force:
                raise self._changed() from None
            self._swap()
            return
        try:
            rename_noreplace(self.temp, self.target)
        except FileExistsError:
            raise self._changed() from None
        self.committed = True

    def _swap(self) -> None:
        try:
            swapped = exchange(self.temp, self.target)
        except FileNotFoundError:
            raise self._changed() from None
        if swapped:
            old = self.temp
        else:
            old = self.temp.with_name(f"{self.temp.name}-old")
            rename_noreplace(self.target, old)
        lost = files_not_in_a_checkpoint(old)
        if lost:
            if swapped:
                exchange(self.temp, self.target)
            else:
                rename_noreplace(old, self.target)
            raise self._changed(lost)
        if not swapped:
            rename_noreplace(self.temp, self.target)
        self.previous = old
        self.committed = True

    def _changed(self, holds: list[str] | None = None) -> OutputFailed:
        now = f" and now holds {_first_few(holds)}" if holds else ""
        return OutputFailed(
            f"OUTPUT_DIR {self.output} was created or changed by someone else during the conversion{now}: "
            "it was left as it was, and the new output discarded"
        )

    def _release(self) -> None:
        if not self.committed:
            shutil.rmtree(self.temp, ignore_errors=True)
            for directory in reversed(self._made_parents):
                try:
                    directory.rmdir()
                except OSError:
                    break
        if self._lock is not None:
            _drop_lock(self._lock, self._sibling(LOCK))
            self._lock = None


def _take_lock(path: Path, output: Path) -> int:
    """flock on OUT.w4tmp-lock, which then holds this pid. The holder removes the file when done,
    so a lock taken on a file that is no longer the one at `path` excludes nobody: take it again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputFailed(f"OUTPUT_DIR {output} is being written by another w4 (pid {_holder(fd)})") from None
            if _is_file_at(fd, path):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _holder(fd: int) -> str:
    # the holder writes its pid right after it takes the lock: give it a moment
    deadline = time.monotonic() + 1.0
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return text
        if time.monotonic() > deadline:
            return "unknown"
        time.sleep(0.01)


def _is_file_at(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return False


def _drop_lock(fd: int, path: Path) -> None:
    # unlink before unlocking, and only the file this run locked: a waiting run then finds
    # either no file or a fresh one, never this one unlocked
    if _is_file_at(fd, path):
        path.unlink()
    os.close(fd)


def _remove_stale_siblings(target: Path) -> None:
    """Remove what runs that are gone left beside OUTPUT_DIR. Called under the lock, so no run is
    writing OUTPUT_DIR; a sibling whose pid is alive is kept all the same (this process, or a
    reused pid)."""
    pattern = re.compile(re.escape(f"{target.name}{TEMP_MARK}") + r"([1-9][0-9]{0,6})-[0-9a-f]{8}(-old)?")
    with os.scandir(target.parent) as entries:
        stale = [entry for entry in entries if (match := pattern.fullmatch(entry.name)) and not _alive(int(match.group(1)))]
    for entry in stale:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _first_few(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown if len(names) <= SHOWN else f"{shown} and {len(names) - SHOWN} more"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

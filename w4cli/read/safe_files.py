"""Opening the files of a checkpoint someone else made.

A checkpoint directory may hold symlinks (the Hub cache is made of them), FIFOs, device nodes or
links that point anywhere on the machine. w4 opens a checkpoint file only if it is a regular file
whose real path lies inside the checkpoint: the directory itself, and for a Hub snapshot the
repo's own `snapshots/` and `blobs/` folders, where the cache's links point. The check is made on
the open descriptor (fstat, and the kernel's own name for it under /proc/self/fd), so a file
swapped between the check and the read cannot slip through. Everything else is refused (exit 4)
naming the file.

JSON documents are parsed with limits on size, nesting and integer length, so a hostile config
is "not valid JSON", never a hang, a memory blow-up or an internal error.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from w4cli.errors import InputRefused

HUB_REPO_PREFIXES = ("models--", "datasets--", "spaces--")
JSON_MAX_BYTES = 256 * 1024 * 1024  # a 150k-tensor index is about 15 MB
JSON_MAX_DEPTH = 64  # configs nest a handful of levels
JSON_MAX_INT_DIGITS = 40  # beyond any count or size a checkpoint holds; int() of huge strings is slow


def allowed_roots(root: Path) -> tuple[Path, ...]:
    """The real directories a file of the checkpoint at `root` may resolve into."""
    real = root.resolve()
    snapshots = real.parent
    repo = snapshots.parent
    if snapshots.name == "snapshots" and repo.name.startswith(HUB_REPO_PREFIXES):
        return (real, repo / "snapshots", repo / "blobs")
    return (real,)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _inside(path: str, roots: tuple[Path, ...]) -> bool:
    return any(path == str(root) or path.startswith(str(root) + os.sep) for root in roots)


def _descriptor_path(fd: int, fallback: Path) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no procfs: the name resolved a moment ago is the best there is
        return os.path.realpath(fallback)


def open_regular(path: Path, root: Path) -> int:
    """A read-only descriptor for `path`, a file of the checkpoint at `root`; InputRefused unless
    it is a regular file whose real path lies inside the checkpoint. The caller closes it."""
    name = _display(path, root)
    try:
        before = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputRefused(f"{name} is a symlink to nothing (dangling)") from None
        raise InputRefused(f"{name} is missing from {root}") from None
    except OSError as exc:
        raise InputRefused(f"{name} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(before.st_mode):
        # refused before open(): opening a FIFO blocks, opening a device can have side effects
        raise InputRefused(f"{name} is {_kind(before.st_mode)}; a checkpoint holds only regular files")
    roots = allowed_roots(root)
    if not _inside(os.path.realpath(path), roots):
        raise InputRefused(f"{name} resolves to {os.path.realpath(path)}, outside the checkpoint; w4 reads only files inside it")
    try:
        # O_NONBLOCK: should the name have become a FIFO since the stat, open() still returns
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputRefused(f"{name} cannot be read: {exc.strerror}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise InputRefused(f"{name} changed while w4 opened it; refusing to read it")
        real = _descriptor_path(fd, path)
        if not _inside(real, roots):
            raise InputRefused(f"{name} resolves to {real}, outside the checkpoint; w4 reads only files inside it")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path, root: Path, limit: int) -> bytes:
    """The whole content of a checked checkpoint file of at most `limit` bytes."""
    fd = open_regular(path, root)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise InputRefused(f"{_display(path, root)} is {size:,} bytes; w4 reads at most {limit:,} for this file")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise InputRefused(f"{_display(path, root)} grew past {limit:,} bytes while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > JSON_MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _depth(document: Any) -> int:
    """Nesting depth, without recursion (the document is untrusted)."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level)
            if level > JSON_MAX_DEPTH:
                return level
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, level + 1) for child in children)
    return deepest


def parse_json(data: bytes, name: str) -> Any:
    """A JSON document from untrusted bytes; InputRefused("... is not valid JSON: why")."""
    try:
        document = json.loads(data.decode("utf-8"), parse_int=_parse_int)
    except RecursionError:
        raise InputRefused(f"{name} is not valid JSON: nested deeper than w4 reads ({JSON_MAX_DEPTH} levels)") from None
    except UnicodeDecodeError as exc:
        raise InputRefused(f"{name} is not valid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # JSONDecodeError, and the integer limit
        raise InputRefused(f"{name} is not valid JSON: {exc}") from None
    if _depth(document) > JSON_MAX_DEPTH:
        raise InputRefused(f"{name} is not valid JSON: nested deeper than w4 reads ({JSON_MAX_DEPTH} levels)")
    return document


def read_json(path: Path, root: Path | None = None) -> dict[str, Any]:
    """A JSON object from a checkpoint file (root: the checkpoint, default the file's folder)."""
    root = path.parent if root is None else root
    document = parse_json(read_regular(path, root, JSON_MAX_BYTES), path.name)
    if not isinstance(document, dict):
        raise InputRefused(f"{path.name} must hold a JSON object")
    return document


def _display(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)

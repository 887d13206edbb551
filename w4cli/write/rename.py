"""Renames that never replace what sits at the target: renameat2(2) with RENAME_NOREPLACE or
RENAME_EXCHANGE (Linux), called through ctypes because Python's os module does not expose it.

Some filesystems (NFS, Lustre, many FUSE mounts) have neither flag and answer EINVAL; glibc older
than 2.28 has no renameat2 at all. There rename_noreplace falls back to rename(2) of a directory,
which can replace an empty directory but never a file or a non-empty one, and exchange reports
that it cannot, so the caller moves the old directory aside instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS}


def _load_renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def _rename_with_flags(source: Path, target: Path, flags: int) -> bool:
    """True when renamed; False when this libc, kernel or filesystem has no such rename."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(source), None, str(target))


def rename_noreplace(source: Path, target: Path) -> None:
    """Rename the directory `source` to `target`; FileExistsError if anything is at `target`."""
    if _rename_with_flags(source, target, _RENAME_NOREPLACE):
        return
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    try:
        os.rename(source, target)
    except OSError as exc:
        # what rename(2) answers when the target that appeared meanwhile is not an empty directory
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        raise


def exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths atomically. False where the filesystem cannot (nothing changed)."""
    return _rename_with_flags(first, second, _RENAME_EXCHANGE)

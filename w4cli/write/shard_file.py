"""How a shard file's bytes reach the disk: with O_DIRECT where the filesystem is a local one that
takes it, through the page cache everywhere else.

Why: w4 writes gigabytes it never reads back, and every byte that goes through the page cache is
copied into it, throttled as dirty memory, written back and reclaimed. On the dev box 13.5 GB of
buffered writes cost 20-35 s of system time while the disk took direct writes at 1.6-2 GB/s
(dev/LOG.md, "bench-stream's writer").

How: the bytes handed to write() are copied into one of two page-aligned staging buffers; each
time one is full it goes out in one direct write, on a thread of its own while the other one
fills (the copies and the disk's writes overlap), so every direct write starts at an offset that
is a multiple of the buffer's size. At close the whole blocks of what is left go out direct and
the last partial block (under BLOCK bytes) through the page cache, O_DIRECT switched off first:
the file ends at its exact size, with no padding to truncate. Where O_DIRECT is refused (EINVAL: the filesystem has
no direct I/O, or wants a larger alignment than BLOCK), the file goes on with ordinary writes,
silently, the same bytes. Network and FUSE filesystems are never asked: there a direct write is a
synchronous round trip to the server, slower than the cache it avoids.

A direct write returns once the device holds the data, perhaps only in its volatile cache: the
fsync before the rename (output_dir.py) is still what makes the output durable, either way.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from pathlib import Path

import numpy as np

from w4cli.write import signals

BLOCK = 4096  # alignment of direct writes' memory, offsets and lengths: a page, >= every common logical block
STAGING_BYTES = 8 << 20  # per buffer: direct writes of 4-64 MiB all ran at the disk's pace; 8 MiB keeps memory small
# local filesystems whose direct I/O goes to a block device (overlay: a container's root, passed on to
# its upper layer, which refuses it where it cannot); anything else is written through the cache
DIRECT_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "overlay"})


def filesystem_type(directory: Path, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding `directory` (its mount in `mountinfo` with the longest
    mount point containing it; the last one mounted there wins), or None where unknown."""
    target = os.path.realpath(directory)
    found: tuple[int, str] | None = None
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as lines:
            for line in lines:
                fields, _, rest = line.partition(" - ")
                parts = fields.split(" ")
                if len(parts) < 5 or not rest:
                    continue
                point = _unescape(parts[4])
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and (found is None or len(point) >= found[0]):
                    found = (len(point), rest.split(" ")[0])
    except OSError:
        return None
    return found[1] if found else None


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as \040, \011, \012, \134
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def staging_for(directory: Path) -> Staging | None:
    """Staging for the shards written into `directory` (one at a time; close() it after the last),
    or None where they go through the page cache: no O_DIRECT on this system, or not a filesystem
    where it pays (DIRECT_FILESYSTEMS)."""
    if not hasattr(os, "O_DIRECT") or filesystem_type(directory) not in DIRECT_FILESYSTEMS:
        return None
    return Staging(STAGING_BYTES)


def aligned_buffer(nbytes: int) -> np.ndarray:
    """`nbytes` (a multiple of BLOCK) of page-aligned memory: an anonymous map always is."""
    assert nbytes > 0 and nbytes % BLOCK == 0
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


class Staging:
    """Two page-aligned buffers of `nbytes`, and the thread that writes a full one while the other
    fills: the copies and the disk's writes overlap."""

    def __init__(self, nbytes: int):
        self.buffers = (aligned_buffer(nbytes), aligned_buffer(nbytes))
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="w4-direct-write")

    def close(self) -> None:
        self.io.shutdown(wait=True)


def open_shard(path: Path, staging: Staging | None):
    """A new file at `path` (never an existing one) with write(bytes-like) and close(): direct
    through `staging` where O_DIRECT is available for it, else Python's buffered file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    if staging is not None:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
            return DirectFile(fd, staging)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this filesystem has no direct I/O
                os.close(fd)
                raise
        except BaseException:
            os.close(fd)
            raise
    return os.fdopen(fd, "wb")


class DirectFile:
    """A file opened with O_DIRECT, written through a staging buffer (see the module's comment).
    One thread calls write() and close(); the staging's I/O thread writes each full buffer, one
    at a time, so the file's writes stay in order."""

    def __init__(self, fd: int, staging: Staging):
        self.fd = fd
        self.direct = True  # False once a direct write was refused: plain writes from then on
        self._staging = staging
        self._current = 0  # which of the two buffers is filling
        self._filled = 0
        self._pending: Future | None = None  # the other buffer's write, while it runs
        self._failed = False
        self.closed = False

    def write(self, data) -> int:
        source = np.frombuffer(data, dtype=np.uint8)
        try:
            done = 0
            while done < source.nbytes:
                buffer = self._staging.buffers[self._current]
                count = min(source.nbytes - done, buffer.nbytes - self._filled)
                # a NumPy copy releases the GIL: the producer thread runs meanwhile
                np.copyto(buffer[self._filled : self._filled + count], source[done : done + count])
                self._filled += count
                done += count
                if self._filled == buffer.nbytes:
                    self._hand_off()
        except BaseException:
            self._failed = True
            raise
        return source.nbytes

    def _hand_off(self) -> None:
        """Start the full buffer's write on the I/O thread, once the one before it has ended, and
        fill the other buffer meanwhile. An error of the write before is raised here."""
        self._wait()
        self._pending = self._staging.io.submit(self._write, self._staging.buffers[self._current], 0, self._filled)
        self._current ^= 1
        self._filled = 0

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _write(self, buffer: np.ndarray, start: int, stop: int) -> None:
        """Write buffer[start:stop]: direct while it is taken, and on the first refusal (EINVAL,
        which writes nothing) the rest through the page cache."""
        view = memoryview(buffer)[start:stop]
        done = 0
        while done < len(view):
            try:
                done += os.write(self.fd, view[done:])
            except OSError as exc:
                # a short direct write (a full disk) leaves the offset unaligned: the next one is
                # refused, and the plain write after it says what is wrong
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                _without_direct_io(self.fd)
                self.direct = False

    def close(self) -> None:
        """Write what is left and close; after a failed write only close (the file is discarded)."""
        if self.closed:
            return
        self.closed = True
        try:
            if not self._failed:
                self._wait()
                buffer = self._staging.buffers[self._current]
                whole = self._filled - self._filled % BLOCK
                self._write(buffer, 0, whole)
                if whole < self._filled:  # the last partial block: direct I/O writes whole blocks only
                    _without_direct_io(self.fd)
                    self._write(buffer, whole, self._filled)
                self._filled = 0
        finally:
            if self._pending is not None:
                # never close the descriptor under a running write; on the main thread this is
                # an abandoned run's clean-up, which a stop request must not cut short
                with signals.held(redeliver=False):
                    wait_for([self._pending])
                self._pending = None
            os.close(self.fd)


def _without_direct_io(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)

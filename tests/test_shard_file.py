"""How shard bytes reach the disk (w4cli/write/shard_file.py): direct writes through a page-aligned
staging buffer where the filesystem takes O_DIRECT, the page cache elsewhere. Whatever the path,
every file holds exactly the bytes written, in order: staging boundaries, the last partial block,
a refusal of O_DIRECT at open or in the middle of a file, and a full disk are all exercised on
real files."""

from __future__ import annotations

import errno
import fcntl
import os
import random
from pathlib import Path

import pytest
import torch

from tests.test_writer import output
from w4cli.write import shard_file
from w4cli.write.shard_file import BLOCK, DirectFile, Staging, filesystem_type, open_shard, staging_for
from w4cli.write.writer import plan_shards, write_shards

STAGING = 4 * BLOCK  # small, so a few KB of writes cross its boundaries many times


@pytest.fixture
def staging():
    staging = Staging(STAGING)
    yield staging
    staging.close()


def direct_here(path: Path, staging: Staging) -> bool:
    """Whether O_DIRECT is taken where the tests write (ext4 on the dev box; CI's /tmp may not be)."""
    probe = path / "probe"
    handle = open_shard(probe, staging)
    handle.close()
    probe.unlink()
    return isinstance(handle, DirectFile)


def chunks_of(sizes: list[int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for size in sizes]


# sizes chosen to land on, just before and just after every boundary: a block, the staging buffer,
# a whole file under one block, nothing at all
SIZES = {
    "nothing": [],
    "empty writes": [0, 0],
    "under a block": [100],
    "one block": [BLOCK],
    "a block and a byte": [BLOCK, 1],
    "the staging buffer": [STAGING],
    "staging minus one": [STAGING - 1],
    "staging plus one": [STAGING + 1],
    "one chunk over many buffers": [5 * STAGING + 123],
    "odd pieces": [8, 3000, 1, 0, 9000, STAGING - 7, 2 * BLOCK, 17],
}


@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
def test_every_byte_arrives_in_order_whatever_the_boundaries(tmp_path, sizes, staging):
    chunks = chunks_of(sizes, seed=len(sizes))
    handle = open_shard(tmp_path / "shard", staging)
    for chunk in chunks:
        assert handle.write(memoryview(chunk)) == len(chunk)
    handle.close()
    handle.close()  # a second close changes nothing
    assert (tmp_path / "shard").read_bytes() == b"".join(chunks)
    if direct_here(tmp_path, staging):
        assert isinstance(handle, DirectFile) and handle.direct


def test_without_staging_the_file_goes_through_the_page_cache(tmp_path):
    handle = open_shard(tmp_path / "shard", None)
    assert not isinstance(handle, DirectFile)
    handle.write(b"abc")
    handle.close()
    assert (tmp_path / "shard").read_bytes() == b"abc"


def test_an_existing_file_is_never_opened(tmp_path, staging):
    (tmp_path / "shard").write_bytes(b"someone's")
    with pytest.raises(FileExistsError):
        open_shard(tmp_path / "shard", staging)
    assert (tmp_path / "shard").read_bytes() == b"someone's"


def test_a_filesystem_that_refuses_o_direct_at_open_gets_plain_writes(tmp_path, monkeypatch, staging):
    real = fcntl.fcntl

    def no_direct_io(fd, command, *args):
        if command == fcntl.F_SETFL and args and args[0] & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, command, *args)

    monkeypatch.setattr(fcntl, "fcntl", no_direct_io)
    chunks = chunks_of(SIZES["odd pieces"], seed=1)
    handle = open_shard(tmp_path / "shard", staging)
    assert not isinstance(handle, DirectFile)
    for chunk in chunks:
        handle.write(chunk)
    handle.close()
    assert (tmp_path / "shard").read_bytes() == b"".join(chunks)


@pytest.mark.parametrize("refused_at", [1, 3], ids=["first write", "third write"])
def test_a_direct_write_refused_mid_file_goes_on_through_the_page_cache(tmp_path, monkeypatch, refused_at, staging):
    if not direct_here(tmp_path, staging):
        pytest.skip("O_DIRECT is not taken on this filesystem; the refusal at open is tested above")
    real = os.write
    calls = []

    def refuses(fd, data):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            calls.append(len(data))
            if len(calls) == refused_at:  # a larger alignment than BLOCK, say
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, data)

    monkeypatch.setattr(os, "write", refuses)
    chunks = chunks_of([3 * STAGING + 5, 10, STAGING], seed=2)
    handle = open_shard(tmp_path / "shard", staging)
    for chunk in chunks:
        handle.write(chunk)
    handle.close()
    assert not handle.direct and len(calls) == refused_at
    assert (tmp_path / "shard").read_bytes() == b"".join(chunks)


def test_a_full_disk_during_a_direct_write_is_raised_and_nothing_more_is_written(tmp_path, monkeypatch, staging):
    if not direct_here(tmp_path, staging):
        pytest.skip("O_DIRECT is not taken on this filesystem; a full disk through the cache is test_output_safety's")
    real = os.write
    room = [STAGING + BLOCK // 2]

    def fills_up(fd, data):
        # what a direct write does when the disk fills: a short write, then ENOSPC
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        count = real(fd, memoryview(data)[: room[0]]) if len(data) > room[0] else real(fd, data)
        room[0] -= count
        return count

    handle = open_shard(tmp_path / "shard", staging)
    monkeypatch.setattr(os, "write", fills_up)
    with pytest.raises(OSError) as raised:
        handle.write(bytes(4 * STAGING))
    assert raised.value.errno == errno.ENOSPC
    handle.close()  # closes only: the file is discarded with the temporary directory
    with pytest.raises(OSError):
        os.fstat(handle.fd)


def test_staging_only_where_direct_io_pays(tmp_path):
    assert filesystem_type(Path("/proc")) == "proc"
    assert staging_for(Path("/proc")) is None
    kind = filesystem_type(tmp_path)
    assert kind is not None
    staging = staging_for(tmp_path)
    assert (staging is not None) == (kind in shard_file.DIRECT_FILESYSTEMS)
    if staging is not None:
        assert all(b.nbytes == shard_file.STAGING_BYTES and b.ctypes.data % BLOCK == 0 for b in staging.buffers)
        staging.close()


def test_mount_points_with_spaces_are_read_back(tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "30 22 0:40 / /mnt/my\\040disk rw - tmpfs tmpfs rw\n"
        "31 22 0:41 / /mnt/my rw shared:1 - nfs4 server:/x rw\n"
        "32 22 0:42 / /mnt/my rw - xfs /dev/sdb1 rw\n"
    )
    where = lambda path: filesystem_type(Path(path), str(mountinfo))
    assert where("/mnt/my disk/out") == "tmpfs"
    assert where("/mnt/my/out") == "xfs"  # mounted over the nfs4 one
    assert where("/mnt/mydisk") == "ext4"
    assert where("/") == "ext4"
    assert filesystem_type(tmp_path, str(tmp_path / "absent")) is None


def test_shards_written_direct_and_through_the_cache_are_identical(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(3)
    values = {
        "embed": torch.randn(97, 33, generator=g).half(),  # odd sizes: no tensor ends on a block
        "norm": torch.randn(33, generator=g).bfloat16(),
        "big": torch.randn(3 * STAGING // 4 + 5, generator=g),  # several staging buffers in one write
        "empty": torch.zeros(0, 4),
        "codes": torch.randint(0, 255, (4097,), generator=g, dtype=torch.uint8),
    }
    plan = plan_shards([output(n, v) for n, v in values.items()], max_shard_size=STAGING, provenance={})
    assert len(plan.files) > 1
    monkeypatch.setattr(shard_file, "STAGING_BYTES", STAGING)
    monkeypatch.setattr(shard_file, "DIRECT_FILESYSTEMS", frozenset({filesystem_type(tmp_path)}))
    (tmp_path / "direct").mkdir()
    write_shards(tmp_path / "direct", plan, lambda n: None)
    monkeypatch.setattr(shard_file, "DIRECT_FILESYSTEMS", frozenset())
    (tmp_path / "cached").mkdir()
    write_shards(tmp_path / "cached", plan, lambda n: None)
    names = sorted(p.name for p in (tmp_path / "cached").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "direct").iterdir())
    for name in names:
        assert (tmp_path / "direct" / name).read_bytes() == (tmp_path / "cached" / name).read_bytes(), name

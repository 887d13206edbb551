"""A checkpoint directory opened for reading: config, weight files, tensor headers.

Opening validates everything that can be checked without reading tensor data: every weight file
parses as safetensors (the safetensors library does the parsing: never by hand), the index names
only plain file names inside the directory, every tensor it lists sits in the shard it names, and
no weight file or tensor is unaccounted for. Tensor data is read later, one tensor group at a time,
so memory stays bounded however large the checkpoint is.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from w4cli.errors import InputRefused
from w4cli.read.safe_files import open_regular, read_json

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

# safetensors dtype codes w4 reads, and the torch dtype each becomes
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
FLOAT_CODES = {"F64", "F32", "F16", "BF16"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str  # shard file name inside the checkpoint directory
    shape: tuple[int, ...]
    dtype: str  # safetensors code: "I32", "F16", ...
    start: int = 0  # byte offset of the tensor's data in its file

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * DTYPES[self.dtype].itemsize



class _Shards:
    """Open descriptors of the checkpoint's weight files, checked once (safe_files.open_regular)
    and kept, so a tensor read costs one positioned read, not a re-parse of its file's header (a
    header holds every tensor of its file: re-opening per tensor is quadratic in the tensor count).
    At most MAX_OPEN stay open; a file opened again must be the same file it was at the check."""

    MAX_OPEN = 32

    def __init__(self, root: Path):
        self.root = root
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.metadata: dict[str, dict[str, str]] = {}  # each file's safetensors __metadata__, as read
        self.identity: dict[str, tuple[int, int, int, int]] = {}
        self._finalizer = weakref.finalize(self, _close_all, self.fds)

    def fd(self, file: str) -> int:
        if file in self.fds:
            self.fds.move_to_end(file)
            return self.fds[file]
        fd = open_regular(self.root / file, self.root)
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self.identity.setdefault(file, identity) != identity:
            os.close(fd)
            raise InputRefused(f"{file} changed on disk while w4 was reading the checkpoint")
        self.fds[file] = fd
        while len(self.fds) > self.MAX_OPEN:
            os.close(self.fds.popitem(last=False)[1])
        return fd

    def close(self) -> None:
        self._finalizer()


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def _pread_into(fd: int, buffer: memoryview, offset: int, file: str) -> None:
    done = 0
    while done < len(buffer):
        count = os.preadv(fd, [buffer[done:]], offset + done)
        if count == 0:
            raise InputRefused(f"{file} ended early: truncated while w4 was reading it")
        done += count


class Checkpoint:
    """Config plus a name -> TensorInfo map; tensors are read on demand."""

    def __init__(self, root: Path, config: dict[str, Any], tensors: dict[str, TensorInfo], sharded: bool, shards: _Shards):
        self.root = root
        self.file_metadata: dict[str, dict[str, str]] = shards.metadata  # each weight file's __metadata__
        self.config = config
        self.tensors = tensors
        self.sharded = sharded
        self.read_seconds = 0.0  # time spent reading tensor data, for the conversion summary
        self._shards = shards

    @property
    def weight_files(self) -> list[str]:
        return sorted({info.file for info in self.tensors.values()})

    def read(self, *names: str) -> dict[str, torch.Tensor]:
        """Read the named tensors straight into fresh CPU tensors (positioned reads: no file stays
        mapped, so resident memory holds only what the caller keeps)."""
        start = time.perf_counter()
        out: dict[str, torch.Tensor] = {}
        for name in names:
            info = self.tensors[name]
            raw = torch.empty(info.nbytes, dtype=torch.uint8)
            if info.nbytes:
                _pread_into(self._shards.fd(info.file), memoryview(raw.numpy()), info.start, info.file)
            # safetensors stores little-endian, C order, as x86 and ARM hosts hold tensors
            out[name] = raw.view(DTYPES[info.dtype]).reshape(info.shape)
        self.read_seconds += time.perf_counter() - start
        return out

    def read_one(self, name: str) -> torch.Tensor:
        return self.read(name)[name]

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start..stop of the tensor (along its first dimension), read alone: a consumer that
        streams a large tensor (a 2 GB embedding) holds a slice of it, never all of it."""
        began = time.perf_counter()
        info = self.tensors[name]
        row_bytes = info.nbytes // info.shape[0] if info.shape and info.shape[0] else 0
        raw = torch.empty((stop - start) * row_bytes, dtype=torch.uint8)
        if raw.numel():
            _pread_into(self._shards.fd(info.file), memoryview(raw.numpy()), info.start + start * row_bytes, info.file)
        self.read_seconds += time.perf_counter() - began
        return raw.view(DTYPES[info.dtype]).reshape(stop - start, *info.shape[1:])

    def close(self) -> None:
        self._shards.close()


def _plain_file_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name.endswith(".safetensors")
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..")
        and not name.startswith("..")
        and ":" not in name
    )


def _no_duplicates(file: str):
    def pairs_to_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        document: dict[str, Any] = {}
        for key, value in pairs:
            if key in document:
                raise InputRefused(f"{file} names tensor {key!r} twice in its header; which one is the tensor?")
            document[key] = value
        return document

    return pairs_to_dict


def _headers(shards: _Shards, file: str) -> dict[str, TensorInfo]:
    """The tensors of one weight file. The safetensors library validates the file (offsets
    contiguous and inside it, sizes matching shapes, nothing trailing); the header is then read
    again only for what the library does not say: duplicate names, which it resolves silently
    (the last wins), and each tensor's byte offset, for positioned reads."""
    from safetensors import SafetensorError, safe_open

    fd = shards.fd(file)
    # through the checked descriptor, so the library reads the file that was checked
    checked = Path(f"/proc/self/fd/{fd}")
    try:
        with safe_open(checked if checked.exists() else shards.root / file, framework="pt", device="cpu") as handle:
            infos = {}
            for name in handle.keys():
                view = handle.get_slice(name)
                infos[name] = (tuple(view.get_shape()), view.get_dtype())
    except SafetensorError as exc:
        raise InputRefused(f"{file} is not a valid safetensors file ({exc}); truncated or corrupt download?") from None
    length = int.from_bytes(os.pread(fd, 8, 0), "little")
    header = os.pread(fd, length, 8)
    try:
        document = json.loads(header.decode("utf-8"), object_pairs_hook=_no_duplicates(file))
    except (UnicodeDecodeError, ValueError) as exc:  # already accepted by the library: cannot happen
        raise InputRefused(f"{file} has a header w4 cannot read ({exc})") from None
    metadata = document.pop("__metadata__", None)
    shards.metadata[file] = dict(metadata) if isinstance(metadata, dict) else {}
    if set(document) != set(infos):
        raise InputRefused(f"{file}: its header and the safetensors library disagree on the tensor names")
    tensors = {}
    for name, (shape, dtype) in infos.items():
        if dtype not in DTYPES:
            raise InputRefused(f"{file}: tensor {name} has dtype {dtype}, which w4 does not read")
        begin = document[name]["data_offsets"][0]
        tensors[name] = TensorInfo(name, file, shape, dtype, 8 + length + begin)
    return tensors


def open_checkpoint(root: Path) -> Checkpoint:
    config = read_json(root / CONFIG, root)
    entries = sorted(root.iterdir())
    present = [p.name for p in entries if p.name.endswith(".safetensors")]
    shards = _Shards(root)
    index_path = root / INDEX

    if index_path.exists() or index_path.is_symlink():
        index = read_json(index_path, root)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputRefused(f"{INDEX} has no weight_map")
        for name, file in weight_map.items():
            if not _plain_file_name(file):
                raise InputRefused(f"{INDEX} maps {name} to {file!r}: shard entries must be plain .safetensors file names inside the checkpoint")
        indexed_files = sorted(set(weight_map.values()))
        stray = sorted(set(present) - set(indexed_files))
        if stray:
            raise InputRefused(f"weight file {stray[0]} is not named by {INDEX}; w4 will not guess which files belong to the checkpoint")
        tensors: dict[str, TensorInfo] = {}
        for file in indexed_files:
            if not (root / file).exists() and not (root / file).is_symlink():
                raise InputRefused(f"weight file {file} is missing")
            for name, info in _headers(shards, file).items():
                listed = weight_map.get(name)
                if listed is None:
                    raise InputRefused(f"tensor {name} in {file} is not listed in {INDEX}")
                if listed != file:
                    raise InputRefused(f"tensor {name} is in {file} but {INDEX} says {listed}")
                tensors[name] = info
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise InputRefused(f"tensor {missing[0]} is listed in {INDEX} but missing from {weight_map[missing[0]]}")
        # keep the index's order: it is the order the producer wrote
        ordered = {name: tensors[name] for name in weight_map}
        return Checkpoint(root, config, ordered, sharded=True, shards=shards)

    if not present:
        pickles = sorted(p.name for p in entries if p.name.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise InputRefused(
                f"{root} holds only pickle weights ({pickles[0]}); w4 reads safetensors only and never loads pickles"
            )
        raise InputRefused(f"no *.safetensors weights in {root}")
    tensors = {}
    for file in present:
        for name, info in _headers(shards, file).items():
            if name in tensors:
                raise InputRefused(f"tensor {name} appears in both {tensors[name].file} and {file}")
            tensors[name] = info
    return Checkpoint(root, config, tensors, sharded=len(present) > 1, shards=shards)

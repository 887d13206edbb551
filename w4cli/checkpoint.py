"""A checkpoint directory opened for reading: config, weight files, tensor headers.

Opening validates everything that can be checked without reading tensor data: every weight file
parses as safetensors (the safetensors library does the parsing: never by hand), the index names
only plain file names inside the directory, every tensor it lists sits in the shard it names, and
no weight file or tensor is unaccounted for. Tensor data is read later, one tensor group at a time,
so memory stays bounded however large the checkpoint is.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from w4cli.errors import InputRefused

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

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * DTYPES[self.dtype].itemsize


def read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputRefused(f"{path.name} is missing from {path.parent}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputRefused(f"{path.name} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InputRefused(f"{path.name} must hold a JSON object")
    return document


class Checkpoint:
    """Config plus a name -> TensorInfo map; tensors are read on demand."""

    def __init__(self, root: Path, config: dict[str, Any], tensors: dict[str, TensorInfo], sharded: bool):
        self.root = root
        self.config = config
        self.tensors = tensors
        self.sharded = sharded
        self.read_seconds = 0.0  # time spent reading tensor data, for the conversion summary

    @property
    def weight_files(self) -> list[str]:
        return sorted({info.file for info in self.tensors.values()})

    def read(self, *names: str) -> dict[str, torch.Tensor]:
        """Read the named tensors, opening each shard once and closing it again, so no file stays
        mapped (mapped pages would count towards resident memory)."""
        from safetensors import safe_open

        start = time.perf_counter()
        by_file: dict[str, list[str]] = {}
        for name in names:
            by_file.setdefault(self.tensors[name].file, []).append(name)
        out: dict[str, torch.Tensor] = {}
        for file, file_names in by_file.items():
            with safe_open(self.root / file, framework="pt", device="cpu") as handle:
                for name in file_names:
                    out[name] = handle.get_tensor(name)
        self.read_seconds += time.perf_counter() - start
        return {name: out[name] for name in names}

    def read_one(self, name: str) -> torch.Tensor:
        return self.read(name)[name]


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


def _headers(root: Path, file: str) -> dict[str, TensorInfo]:
    from safetensors import SafetensorError, safe_open

    path = root / file
    if not path.is_file():
        raise InputRefused(f"weight file {file} is missing")
    try:
        with safe_open(path, framework="pt", device="cpu") as handle:
            infos = {}
            for name in handle.keys():
                view = handle.get_slice(name)
                infos[name] = TensorInfo(name, file, tuple(view.get_shape()), view.get_dtype())
    except SafetensorError as exc:
        raise InputRefused(f"{file} is not a valid safetensors file ({exc}); truncated or corrupt download?") from None
    for info in infos.values():
        if info.dtype not in DTYPES:
            raise InputRefused(f"{file}: tensor {info.name} has dtype {info.dtype}, which w4 does not read")
    return infos


def open_checkpoint(root: Path) -> Checkpoint:
    config = read_json(root / CONFIG)
    present = sorted(p.name for p in root.iterdir() if p.name.endswith(".safetensors"))
    index_path = root / INDEX

    if index_path.is_file():
        index = read_json(index_path)
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
            for name, info in _headers(root, file).items():
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
        return Checkpoint(root, config, ordered, sharded=True)

    if not present:
        pickles = sorted(p.name for p in root.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
        if pickles:
            raise InputRefused(
                f"{root} holds only pickle weights ({pickles[0]}); w4 reads safetensors only and never loads pickles"
            )
        raise InputRefused(f"no *.safetensors weights in {root}")
    tensors = {}
    for file in present:
        for name, info in _headers(root, file).items():
            if name in tensors:
                raise InputRefused(f"tensor {name} appears in both {tensors[name].file} and {file}")
            tensors[name] = info
    return Checkpoint(root, config, tensors, sharded=len(present) > 1)

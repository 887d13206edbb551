"""Write a Hugging Face checkpoint atomically: shards planned up front, written one at a time.

The directory is built in a temporary sibling (same filesystem) and renamed into place only once
every file is written and synced, so an error or Ctrl-C never leaves anything at OUTPUT_DIR that
looks complete. Peak memory is one output shard plus the inputs of the tensor being produced.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from w4cli.errors import InputRefused, UsageError

SHARD_PATTERN = "model{suffix}.safetensors"
INDEX = "model.safetensors.index.json"
TEMP_MARK = ".w4tmp-"


@dataclass
class OutputTensor:
    """A tensor of the output checkpoint, produced on demand."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    produce: Callable[[], torch.Tensor]
    source_bytes: int  # bytes read from the input to produce it (for the summary)

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * self.dtype.itemsize


def parse_size(text: str) -> int:
    from huggingface_hub.serialization._base import parse_size_to_int

    try:
        size = parse_size_to_int(text)
    except ValueError:
        raise UsageError(f"--max-shard-size '{text}' is not a size like 5GB or 500MB") from None
    if size <= 0:
        raise UsageError("--max-shard-size must be positive")
    return size


def check_output_dir(output: Path, inputs: Iterable[Path], force: bool) -> None:
    """Refuse an output that would clobber data or sit inside an input, before any work."""
    target = output.resolve()
    for source in inputs:
        source = source.resolve()
        if target == source or source in target.parents:
            raise InputRefused(f"OUTPUT_DIR {output} is inside the input checkpoint {source}")
        if target in source.parents:
            raise InputRefused(f"OUTPUT_DIR {output} contains the input checkpoint {source}")
    if output.exists():
        if not output.is_dir():
            raise InputRefused(f"OUTPUT_DIR {output} exists and is not a directory")
        if any(output.iterdir()) and not force:
            raise InputRefused(f"OUTPUT_DIR {output} is not empty (pass --force to replace it)")


class AtomicDirectory:
    """A temporary sibling directory that becomes `target` on commit() and vanishes otherwise."""

    def __init__(self, target: Path):
        self.target = target
        self.temp = target.parent / f"{target.name}{TEMP_MARK}{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> AtomicDirectory:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.temp.mkdir()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.temp.exists():
            shutil.rmtree(self.temp, ignore_errors=True)

    def commit(self) -> None:
        # safetensors writes through a private temp file (mode 0600); give the files the mode any
        # other file the user creates would get
        mode = 0o666 & ~_umask()
        for path in self.temp.iterdir():
            path.chmod(mode)
            _fsync(path)
        _fsync(self.temp)
        if self.target.exists():
            if any(self.target.iterdir()):
                # rename(2) replaces only an empty directory: move the old one aside first
                old = self.target.parent / f"{self.target.name}{TEMP_MARK}old-{uuid.uuid4().hex[:8]}"
                self.target.rename(old)
                self.temp.rename(self.target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                self.target.rmdir()
                self.temp.rename(self.target)
        else:
            self.temp.rename(self.target)
        _fsync(self.target.parent)


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


@dataclass
class ShardPlan:
    files: dict[str, list[OutputTensor]]  # file name -> tensors, in order
    index: dict[str, Any] | None  # the index JSON, None for a single model.safetensors


def plan_shards(tensors: list[OutputTensor], max_shard_size: int) -> ShardPlan:
    """Shard boundaries from shapes alone (meta tensors), with huggingface_hub's own splitter so
    file names, order and the index match what `save_pretrained` writes."""
    from huggingface_hub import split_torch_state_dict_into_shards

    by_name = {t.name: t for t in tensors}
    meta = {t.name: torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors}
    split = split_torch_state_dict_into_shards(meta, filename_pattern=SHARD_PATTERN, max_shard_size=max_shard_size)
    files = {file: [by_name[name] for name in names] for file, names in split.filename_to_tensors.items()}
    index = None
    if split.is_sharded:
        index = {"metadata": dict(split.metadata), "weight_map": dict(split.tensor_to_filename)}
    return ShardPlan(files, index)


def write_shards(directory: Path, plan: ShardPlan, advance: Callable[[int], None]) -> tuple[float, float]:
    """Produce and write every shard; returns (seconds producing tensors, seconds writing files).

    Shard i is written on a background thread while shard i+1 is produced (safetensors releases
    the GIL while it writes), so a conversion runs at the pace of the slower of the two instead of
    their sum. At most two shards are in memory: the one being written and the one being built.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    producing = writing = 0.0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="w4-writer") as pool:
        pending: Future[float] | None = None
        for file, members in plan.files.items():
            shard = {}
            start = time.perf_counter()
            for tensor in members:
                value = tensor.produce()
                if tuple(value.shape) != tensor.shape or value.dtype != tensor.dtype:
                    raise AssertionError(
                        f"{tensor.name}: produced {value.dtype}{list(value.shape)}, planned {tensor.dtype}{list(tensor.shape)}"
                    )
                shard[tensor.name] = value.contiguous()
                advance(tensor.nbytes)
            producing += time.perf_counter() - start
            if pending is not None:
                writing += pending.result()  # also re-raises a failed write
            pending = pool.submit(_save_shard, shard, directory / file)
            del shard
        if pending is not None:
            writing += pending.result()
    if plan.index is not None:
        write_json(directory / INDEX, plan.index)
    return producing, writing


def _save_shard(shard: dict[str, torch.Tensor], path: Path) -> float:
    from safetensors.torch import save_file

    start = time.perf_counter()
    # {"format": "pt"}: transformers refuses shards without it
    save_file(shard, path, metadata={"format": "pt"})
    return time.perf_counter() - start


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def copy_files(source: Path, directory: Path, names: Iterable[str]) -> None:
    for name in names:
        # copyfile follows the Hub cache's symlinks into blobs/, so the output holds real files
        shutil.copyfile(source / name, directory / name)

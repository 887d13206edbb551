"""The one way w4 writes a checkpoint (write_checkpoint): shards planned from the output tensors'
shapes, written tensor by tensor, then config, index and the copied files. `w4 dequantize` and
`w4 repack` differ only in the tensors and config they hand in.

Everything goes into the temporary sibling of OUTPUT_DIR that output_dir.py claims and renames
into place once every file is written. Tensors are streamed into their shard files as they are
produced, so peak memory is about two output tensors plus the inputs of the one being produced,
whatever the shard size. How the bytes reach the disk (O_DIRECT where it pays) is shard_file.py's.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from w4cli.write import shard_file, signals
from w4cli.read.checkpoint import DTYPES
from w4cli.console import byte_progress
from w4cli.errors import UsageError

if TYPE_CHECKING:
    from w4cli.read.checkpoint import Checkpoint
    from w4cli.write.output_dir import OutputDirectory

SHARD_PATTERN = "model{suffix}.safetensors"
INDEX = "model.safetensors.index.json"
HAND_OVER_WAIT_S = 0.05  # longest a stop request waits while the writer thread is busy


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


@dataclass
class ConversionReport:
    """What write_checkpoint wrote and where its time went, for the command's summary."""

    output: Path
    files: list[str]
    tensors: int
    bytes_in: int
    bytes_out: int
    seconds: float
    read_seconds: float  # reading input tensors
    compute_seconds: float  # turning them into output tensors
    write_seconds: float  # writing shards

    def fields(self) -> dict[str, Any]:
        """The numbers every conversion command reports, for its table or JSON."""
        return {
            "files": self.files,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 3),
            "read_seconds": round(self.read_seconds, 3),
            "compute_seconds": round(self.compute_seconds, 3),
            "write_seconds": round(self.write_seconds, 3),
            "bound_by": self.bound_by,
            "mb_per_s": round(self.mb_per_s, 1),
            "output": str(self.output),
        }

    @property
    def bound_by(self) -> str:
        """What the conversion spent most of its time on: the limit to raise for a faster run.

        Tensors stream through two stages at once: the main thread reads and computes one while a
        writer thread writes the one before (write_shards), so the stream takes about as
        long as the slower stage. Whatever the run did besides (resolving MODEL, validating,
        planning, copying small files, syncing, renaming) is "other work": it bounds the run when
        it took at least as long as the stream, as it does for a small checkpoint, whose tensor
        times round to zero. Otherwise the slower stage bounds it: "writing", or the larger of
        "reading" and "compute".
        """
        producing = self.read_seconds + self.compute_seconds
        stream = max(producing, self.write_seconds)
        if self.seconds - stream >= stream:
            return "other work"
        if self.write_seconds > producing:
            return "writing"
        return "reading" if self.read_seconds >= self.compute_seconds else "compute"

    @property
    def mb_per_s(self) -> float:
        return self.bytes_out / 1e6 / self.seconds if self.seconds > 0 else 0.0


def write_checkpoint(
    source: Checkpoint,
    output: OutputDirectory,
    tensors: list[OutputTensor],
    config: dict[str, Any],
    aux_files: list[str],
    max_shard_size: int,
    label: str,
    provenance: dict[str, str],
) -> ConversionReport:
    """Write the checkpoint into the claimed OUTPUT_DIR's temporary sibling and put it in place."""
    start = time.perf_counter()
    plan = plan_shards(tensors, max_shard_size, provenance)
    total = sum(t.nbytes for t in tensors)
    with output.writing():
        with byte_progress(label, total) as advance:
            producing, writing = write_shards(output.temp, plan, advance)
        write_json(output.temp / "config.json", config)
        copy_files(source.root, output.temp, aux_files)
        files = sorted(p.name for p in output.temp.iterdir())
        output.commit()
    return ConversionReport(
        output=output.output,
        files=files,
        tensors=len(tensors),
        bytes_in=sum(t.source_bytes for t in tensors),
        bytes_out=total,
        seconds=time.perf_counter() - start,
        read_seconds=source.read_seconds,
        compute_seconds=max(0.0, producing - source.read_seconds),
        write_seconds=writing,
    )


@dataclass
class ShardPlan:
    files: dict[str, list[OutputTensor]]  # file name -> tensors, in order
    index: dict[str, Any] | None  # the index JSON, None for a single model.safetensors
    metadata: dict[str, str]  # every shard's safetensors metadata


def plan_shards(tensors: list[OutputTensor], max_shard_size: int, provenance: dict[str, str]) -> ShardPlan:
    """Shard boundaries from shapes alone (meta tensors), with huggingface_hub's own splitter so
    file names, order and the index match what `save_pretrained` writes. Every shard's metadata
    is transformers' `format: pt` plus `provenance` (w4cli/write/provenance.py)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    by_name = {t.name: t for t in tensors}
    meta = {t.name: torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors}
    split = split_torch_state_dict_into_shards(meta, filename_pattern=SHARD_PATTERN, max_shard_size=max_shard_size)
    files = {file: [by_name[name] for name in names] for file, names in split.filename_to_tensors.items()}
    index = None
    if split.is_sharded:
        index = {"metadata": dict(split.metadata), "weight_map": dict(split.tensor_to_filename)}
    return ShardPlan(files, index, {**SHARD_METADATA, **provenance})


# torch dtype -> safetensors dtype code: what w4 reads, it writes
SAFETENSORS_CODES = {dtype: code for code, dtype in DTYPES.items()}
SHARD_METADATA = {"format": "pt"}  # transformers refuses shards without it


def safetensors_header(tensors: list[OutputTensor], metadata: dict[str, str]) -> bytes:
    """The 8-byte length and JSON header of a safetensors file holding `tensors` in this order:
    offsets contiguous from 0, header padded with spaces to a multiple of 8 (the format's rules)."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": SAFETENSORS_CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def _raw_bytes(value: torch.Tensor) -> memoryview:
    # little-endian, C order: what safetensors stores (x86 and ARM hosts are little-endian)
    flat = value.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


class _Writer:
    """Writes byte chunks on a background thread, in order, so the next tensor is computed while
    this one goes to disk (file writes release the GIL). At most one chunk waits in the queue,
    so memory holds about two output tensors, whatever the shard size."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="w4-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, chunk = item
            if self.error is not None:
                continue  # drain after a failure; the producer raises it
            try:
                start = time.perf_counter()
                if chunk is None:
                    handle.close()
                else:
                    handle.write(chunk)
                self.seconds += time.perf_counter() - start
            except BaseException as exc:  # noqa: BLE001 - handed to the producer thread
                self.error = exc

    def _hand_over(self, item) -> None:
        """Queue `item` with stop requests held: a KeyboardInterrupt inside the queue's Python
        locks can lose the wake-up the writer waits for (w4cli/write/signals.py). Each attempt waits a
        short while, so a held request takes effect between attempts, not after a long write."""
        while True:
            with signals.held():
                try:
                    self._queue.put(item, timeout=HAND_OVER_WAIT_S)
                    return
                except queue.Full:
                    pass

    def put(self, handle, chunk) -> None:
        if self.error is not None:
            raise self.error
        self._hand_over((handle, chunk))

    def finish(self) -> None:
        self._hand_over(None)
        self._thread.join()
        if self.error is not None:
            raise self.error


def write_shards(directory: Path, plan: ShardPlan, advance: Callable[[int], None]) -> tuple[float, float]:
    """Produce and write every shard, streaming: a shard's header is known from the plan, so each
    tensor is written as soon as it is produced and freed right after. Peak memory is about two
    output tensors (the one being written and the one being computed), not a shard. Every file is
    read back through the safetensors library afterwards to check its header against the plan.
    Returns (seconds producing tensors, seconds writing files)."""
    producing = 0.0
    staging = shard_file.staging_for(directory)
    writer = _Writer()
    handles = []
    try:
        for file, members in plan.files.items():
            handle = shard_file.open_shard(directory / file, staging)
            handles.append(handle)
            writer.put(handle, safetensors_header(members, plan.metadata))
            for tensor in members:
                start = time.perf_counter()
                value = tensor.produce()
                if tuple(value.shape) != tensor.shape or value.dtype != tensor.dtype:
                    raise AssertionError(
                        f"{tensor.name}: produced {value.dtype}{list(value.shape)}, planned {tensor.dtype}{list(tensor.shape)}"
                    )
                producing += time.perf_counter() - start
                writer.put(handle, _raw_bytes(value))
                del value
                advance(tensor.nbytes)
            writer.put(handle, None)  # close
        writer.finish()
    finally:
        try:
            if writer.error is None and writer._thread.is_alive():
                writer.finish()
            for handle in handles:
                handle.close()
        finally:
            if staging is not None:
                staging.close()
    for file, members in plan.files.items():
        _check_written(directory / file, members, plan.metadata)
    if plan.index is not None:
        write_json(directory / INDEX, plan.index)
    return producing, writer.seconds


def _check_written(path: Path, members: list[OutputTensor], expected_metadata: dict[str, str]) -> None:
    """The safetensors library must read back exactly the planned header (names, dtypes, shapes)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as handle:
        found = {name: (handle.get_slice(name).get_dtype(), tuple(handle.get_slice(name).get_shape())) for name in handle.keys()}
        metadata = handle.metadata()
    planned = {t.name: (SAFETENSORS_CODES[t.dtype], t.shape) for t in members}
    if found != planned or metadata != expected_metadata:
        raise AssertionError(f"{path.name}: the written header does not read back as planned")


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def copy_files(source: Path, directory: Path, names: Iterable[str]) -> None:
    """Copy checkpoint files byte for byte. Each is opened through safe_files.open_regular (a
    regular file inside the checkpoint; the Hub cache's links into blobs/ qualify), so the output
    holds real files and nothing from elsewhere on the machine. New files get the mode any file
    the user creates gets, never the source's."""
    from w4cli.read.safe_files import open_regular

    for name in names:
        with os.fdopen(open_regular(source / name, source), "rb") as src, open(directory / name, "xb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

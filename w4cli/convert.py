"""The one way w4 writes a checkpoint: plan shards from the output tensors' shapes, write them
tensor by tensor into an atomic directory, then config, index and the copied files.
`w4 dequantize` and `w4 repack` differ only in the tensors and config they hand in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from w4cli.checkpoint import Checkpoint
from w4cli.console import byte_progress
from w4cli.output_dir import OutputDirectory
from w4cli.writer import OutputTensor, copy_files, plan_shards, write_json, write_shards


@dataclass
class ConversionReport:
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
        writer thread writes the one before (writer.write_shards), so the stream takes about as
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

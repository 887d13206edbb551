"""Write a GGUF file with the gguf package's GGUFWriter, streaming: every key and tensor info is
known before any data (tensor shapes come from the plan), so the header goes out first and then
the tensors one at a time, each in pieces produced, written and freed before the next. Peak memory
is the largest quantized linear's inputs and blocks (or 64 MB of an unquantized tensor), whatever
the model's size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from w4cli.console import byte_progress
from w4cli.gguf.arch import Architecture, positive_int, write_hparams
from w4cli.gguf.metadata import staged, write_general
from w4cli.gguf.output_file import OutputFile
from w4cli.gguf.plan import GgufTensor, file_type
from w4cli.gguf.tokenizer import Vocabulary, write_tokenizer
from w4cli.read.layers import QuantModel


class _Pieces:
    """One planned tensor for GGUFWriter.write_tensor_data, which pads the file, checks `nbytes`
    against the tensor info and calls `tofile`: here each piece is produced, checked against the
    plan and written in turn, so the tensor is never whole in memory."""

    def __init__(self, tensor: GgufTensor, advance: Callable[[int], None]):
        self.tensor = tensor
        self.nbytes = tensor.nbytes
        self.advance = advance

    def tofile(self, handle) -> None:
        t = self.tensor
        rows = 0
        for piece in t.pieces():
            if piece.dtype != np.uint8 or tuple(piece.shape[1:]) != t.byte_shape[1:] or rows + piece.shape[0] > t.byte_shape[0]:
                raise AssertionError(f"{t.name}: produced a uint8{list(piece.shape)} piece at row {rows}, planned uint8{list(t.byte_shape)}")
            piece.tofile(handle)
            rows += piece.shape[0]
            self.advance(piece.nbytes)
        if rows != t.byte_shape[0]:
            raise AssertionError(f"{t.name}: produced {rows} rows, planned {t.byte_shape[0]}")


@dataclass
class GgufReport:
    files: list[Path]
    tensors: int
    bytes_out: int
    seconds: float
    pre_tokenizer: str
    vocab_size: int

    def fields(self) -> dict[str, Any]:
        return {
            "files": [str(f) for f in self.files],
            "tensors": self.tensors,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.bytes_out / 1e6 / self.seconds, 1) if self.seconds > 0 else 0.0,
            "pre_tokenizer": self.pre_tokenizer,
            "vocab_size": self.vocab_size,
        }


def prepared_writer(model: QuantModel, arch: Architecture, tensors: list[GgufTensor], name: str, repo_id: str | None,
                    provenance: dict[str, str], split_max_size: int = 0) -> tuple[gguf.GGUFWriter, Vocabulary]:
    """A GGUFWriter holding every key and tensor info of the file, no data: what `w4 gguf` writes
    and what `w4 verify OUT.gguf --against MODEL` expects."""
    config = model.checkpoint.config
    writer = gguf.GGUFWriter(None, arch.name, split_max_size=split_max_size)
    for t in tensors:
        writer.add_tensor_info(t.name, t.byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=t.qtype)
    with staged(model.checkpoint.root, name) as staged_dir:
        write_general(writer, staged_dir, name, provenance, repo_id)
        write_hparams(writer, config, arch)
        writer.add_file_type(file_type(tensors))
        vocab = write_tokenizer(writer, staged_dir, positive_int(config, "vocab_size"))
    return writer, vocab


def write_gguf(
    model: QuantModel,
    arch: Architecture,
    tensors: list[GgufTensor],
    output: OutputFile,
    name: str,
    repo_id: str | None,
    provenance: dict[str, str],
    split_max_size: int,
) -> GgufReport:
    start = time.perf_counter()
    writer, vocab = prepared_writer(model, arch, tensors, name, repo_id, provenance, split_max_size)
    path = output.temp / output.target.name
    output.check_replaceable([output.target.parent / p.name for p in writer.format_shard_names(path)])
    total = sum(t.nbytes for t in tensors)
    with output.writing():
        try:
            writer.write_header_to_file(path)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            with byte_progress("gguf", total) as advance:
                for t in tensors:
                    writer.write_tensor_data(_Pieces(t, advance))  # type: ignore[arg-type]
        finally:
            writer.close()
        files = output.commit([p.name for p in writer.format_shard_names(path)])
    return GgufReport(files, len(tensors), total, time.perf_counter() - start, vocab.pre, len(vocab.tokens))

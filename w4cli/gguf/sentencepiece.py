"""A SentencePiece `tokenizer.model` read as data: its pieces, scores and piece types, and whether it
adds a leading space. Llama 2 and Mistral 7B (v0.1-v0.3) ship one; llama.cpp's "llama" tokenizer
merges by these scores.

The file is a protocol buffer (sentencepiece_model.proto, ModelProto). Only what GGUF needs is read,
straight from the wire format (no protobuf or sentencepiece library, nothing executed):

    ModelProto      1: pieces (repeated SentencePiece)   2: trainer_spec   3: normalizer_spec
    SentencePiece   1: piece (string)   2: score (float)   3: type (enum, default NORMAL = 1)
    TrainerSpec     3: model_type (enum: UNIGRAM 1, BPE 2, WORD 3, CHAR 4; default UNIGRAM)
    NormalizerSpec  3: add_dummy_prefix (bool, default true)

The piece types are GGUF's token types, value for value (NORMAL 1, UNKNOWN 2, CONTROL 3,
USER_DEFINED 4, UNUSED 5, BYTE 6).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from w4cli.errors import InputRefused

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
BPE = 2
TYPES = range(1, 7)


@dataclass
class SentencePieceModel:
    pieces: list[str]
    scores: list[float]
    types: list[int]
    add_dummy_prefix: bool


def _refused(why: str) -> InputRefused:
    return InputRefused(f"tokenizer.model is not a SentencePiece model w4 reads: {why}")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise _refused("a varint runs past the end")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            return value, at


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one message: an int for varints and fixed-width
    fields (their raw little-endian bits), bytes for length-delimited ones."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, at = _varint(data, at)
        elif wire in (FIXED32, FIXED64):
            width = 4 if wire == FIXED32 else 8
            if at + width > len(data):
                raise _refused("a fixed-width field runs past the end")
            value, at = int.from_bytes(data[at : at + width], "little"), at + width
        elif wire == LENGTH:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise _refused("a field's length runs past the end")
            value, at = data[at : at + size], at + size
        else:
            raise _refused(f"wire type {wire}")
        yield number, wire, value


def read_model(data: bytes) -> SentencePieceModel:
    pieces, scores, types = [], [], []
    model_type, add_dummy_prefix = 1, True
    for number, wire, value in fields(data):
        if number == 1 and wire == LENGTH:
            piece, score, kind = None, 0.0, 1
            for n, w, v in fields(value):  # type: ignore[arg-type]
                if n == 1 and w == LENGTH:
                    try:
                        piece = bytes(v).decode("utf-8")  # type: ignore[arg-type]
                    except UnicodeDecodeError:
                        raise _refused(f"piece {len(pieces)} is not UTF-8") from None
                elif n == 2 and w == FIXED32:
                    score = struct.unpack("<f", int(v).to_bytes(4, "little"))[0]  # type: ignore[arg-type]
                elif n == 3 and w == VARINT:
                    kind = int(v)  # type: ignore[arg-type]
            if piece is None or kind not in TYPES:
                raise _refused(f"piece {len(pieces)} has no text or an unknown type")
            pieces.append(piece)
            scores.append(score)
            types.append(kind)
        elif number == 2 and wire == LENGTH:
            model_type = next((int(v) for n, w, v in fields(value) if n == 3 and w == VARINT), 1)  # type: ignore[arg-type]
        elif number == 3 and wire == LENGTH:
            add_dummy_prefix = next((bool(v) for n, w, v in fields(value) if n == 3 and w == VARINT), True)  # type: ignore[arg-type]
    if not pieces:
        raise _refused("it holds no pieces")
    if model_type != BPE:
        raise _refused(f"its model type is {model_type}, not BPE (2), the kind llama.cpp's llama tokenizer runs")
    return SentencePieceModel(pieces, scores, types, add_dummy_prefix)

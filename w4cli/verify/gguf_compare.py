"""`w4 verify OUT.gguf --against SOURCE`: a `w4 gguf` file checked against what `w4 gguf` writes for
SOURCE now, tensor by tensor (the file is memory-mapped; one fresh tensor in memory at a time).

Rows: GGUF file (it opens, every part of a split file); metadata keys (every key but the
tokenizer's, value and type); tokenizer (vocabulary, token types, merges, special ids, chat
template); tensor names (the same, in order); tensors (type, shape, bytes: each block's codes, d
and m as derived from SOURCE's codes, zeros and scales); provenance (w4.source and the revision SOURCE
resolves to).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from w4cli.gpu.checks import Mismatch
from w4cli.console import steps
from w4cli.errors import InputRefused
from w4cli.read.hub import Snapshot
from w4cli.verify.report import Report, run_check

GROUP = "gguf"
COMPARED = {
    "GGUF file": "OUT read by the gguf package's reader (every part of a split file)",
    "metadata keys": "every key but the tokenizer's vs what w4 gguf writes for SOURCE",
    "tokenizer": "tokenizer.* keys vs SOURCE's tokenizer files",
    "tensor names": "OUT's tensors vs a fresh plan for SOURCE, in order",
    "tensors": "every tensor's type, shape and bytes vs a fresh conversion of SOURCE",
    "provenance": "w4.source / w4.source_revision vs SOURCE as resolved",
}
NOT_COMPARED = ("GGUF.", "split.", "w4.")  # the container's own fields, part numbering, provenance (its own row)
PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def is_gguf(path: Path) -> bool:
    from w4cli.gguf.output_file import is_gguf_file

    return is_gguf_file(path)


def _parts(path: Path) -> list[Path]:
    match = PART.search(path.name)
    if match is None:
        return [path]
    count = int(match.group(2))
    return [path.with_name(PART.sub(f"-{i:05d}-of-{count:05d}.gguf", path.name)) for i in range(1, count + 1)]


def _read(path: Path) -> tuple[dict[str, Any], dict[str, gguf.ReaderTensor]]:
    fields: dict[str, Any] = {}
    tensors: dict[str, gguf.ReaderTensor] = {}
    for part in _parts(path):
        if not is_gguf(part):
            raise InputRefused(f"{part} is not a GGUF file")
        reader = gguf.GGUFReader(part)
        if not fields:
            fields = dict(reader.fields)
        tensors.update({t.name: t for t in reader.tensors})
    return fields, tensors


def _same(field, want: gguf.GGUFValue) -> bool:
    got = field.contents()
    if field.types[0] != want.type:
        return False
    if want.type == gguf.GGUFValueType.ARRAY:
        if want.sub_type is not None and field.types[-1] != want.sub_type:
            return False
        if want.sub_type == gguf.GGUFValueType.FLOAT32:
            return np.array_equal(np.float32(got), np.float32(want.value))
        return list(got) == [int(v) if isinstance(v, int) else v for v in want.value]
    if want.type in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
        dtype = np.float32 if want.type == gguf.GGUFValueType.FLOAT32 else np.float64
        return dtype(got) == dtype(want.value)
    return got == want.value


def _keys(fields: dict[str, Any], expected: dict[str, gguf.GGUFValue], tokenizer: bool) -> Callable[[], str]:
    def body() -> str:
        def chosen(key: str) -> bool:
            return not key.startswith(NOT_COMPARED) and key.startswith("tokenizer.") == tokenizer

        want = {k: v for k, v in expected.items() if chosen(k)}
        got = {k: f for k, f in fields.items() if chosen(k)}
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        if missing or extra:
            raise Mismatch(f"keys missing: {missing[:3]}, unexpected: {extra[:3]}")
        differing = [k for k in want if not _same(got[k], want[k])]
        if differing:
            shown = repr(got[differing[0]].contents())
            raise Mismatch(f"{len(differing)} keys differ; {differing[0]} is {shown[:60]}")
        return f"{len(want)} keys as w4 gguf writes them for SOURCE"

    return body


def _block_difference(tensor, first_row: int, got: np.ndarray, want: np.ndarray) -> str:
    """Where a tensor's bytes first differ (pieces of rows from `first_row`, each flattened), in
    the block's terms where it has blocks: a stacked expert tensor's first dimension is the expert."""
    piece_row, byte = (int(i) for i in np.argwhere(got != want)[0])
    row_bytes = tensor.byte_shape[-1]
    inner, column = divmod(byte, row_bytes)
    if len(tensor.byte_shape) == 3:
        where = f"expert {first_row + piece_row}, row {inner}"
    else:
        where = f"row {first_row + piece_row + inner}"
    if tensor.qtype.name not in ("Q4_0", "Q4_1"):
        return f"{tensor.name}: {where}, byte {column}: differ"
    block, offset = divmod(column, gguf.GGML_QUANT_SIZES[tensor.qtype][1])
    header = 2 if tensor.qtype.name == "Q4_0" else 4
    part = "d" if offset < 2 else "m" if offset < header else "codes"
    return f"{tensor.name}: {where}, block {block}: {part} differ"


def _tensors(got: dict[str, gguf.ReaderTensor], plan: list, advance: Callable[[str], None]) -> Callable[[], str]:
    def body() -> str:
        for tensor in plan:
            found = got[tensor.name]
            if found.tensor_type != tensor.qtype:
                raise Mismatch(f"{tensor.name} is {found.tensor_type.name}, expected {tensor.qtype.name}")
            if found.n_bytes != tensor.nbytes:
                raise Mismatch(f"{tensor.name} holds {found.n_bytes} bytes, expected {tensor.nbytes}")
            data = np.asarray(found.data).view(np.uint8).reshape(tensor.byte_shape)
            row = 0
            for piece in tensor.pieces():
                stored = data[row : row + piece.shape[0]]
                if not np.array_equal(stored, piece):
                    raise Mismatch(_block_difference(tensor, row, stored.reshape(piece.shape[0], -1), piece.reshape(piece.shape[0], -1)))
                row += piece.shape[0]
            advance(tensor.name)
        return f"{len(plan)} tensors bit-identical to a fresh conversion of SOURCE"

    return body


def _provenance(fields: dict[str, Any], source: Snapshot) -> Callable[[], str]:
    def body() -> str:
        recorded = {k: f.contents() for k, f in fields.items() if k.startswith("w4.")}
        if not recorded:
            raise Mismatch("OUT records no w4.* provenance keys: it was not written by w4 gguf")
        want = source.repo_id or str(source.path)
        if recorded.get("w4.source") != want:
            raise Mismatch(f"OUT records w4.source {recorded.get('w4.source')!r}, but SOURCE is {want!r}")
        revision = recorded.get("w4.source_revision", "")
        if source.revision and revision and revision != source.revision:
            raise Mismatch(f"OUT was made from revision {revision}, SOURCE resolves to {source.revision}")
        return f"made from {want} by w4 {recorded.get('w4.version', '?')}"

    return body


def run(report: Report, output: Path, source: Snapshot) -> None:
    from w4cli.gguf.arch import architecture
    from w4cli.gguf.plan import plan_tensors
    from w4cli.gguf.write import prepared_writer
    from w4cli.read.source import open_quantized

    opened: dict[str, Any] = {}

    def read() -> str:
        opened["fields"], opened["tensors"] = _read(output)
        return f"{len(_parts(output))} file(s), {len(opened['tensors'])} tensors"

    if run_check(report, "GGUF file", COMPARED["GGUF file"], read, GROUP).status != "PASS":
        return
    fields, tensors = opened["fields"], opened["tensors"]
    model = open_quantized(source.path)
    arch = architecture(model.checkpoint.config)
    plan = plan_tensors(model, arch, _outtype(tensors, plan_tensors(model, arch, None)))
    recorded = {"w4_" + k.removeprefix("w4."): f.contents() for k, f in fields.items() if k.startswith("w4.")}
    writer, _ = prepared_writer(model, arch, plan, source.repo_id or source.path.name, source.repo_id, recorded)
    expected = writer.kv_data[0]
    run_check(report, "metadata keys", COMPARED["metadata keys"], _keys(fields, expected, tokenizer=False), GROUP)
    run_check(report, "tokenizer", COMPARED["tokenizer"], _keys(fields, expected, tokenizer=True), GROUP)

    def names() -> str:
        want, got = [t.name for t in plan], list(tensors)
        if want != got:
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            raise Mismatch(f"missing {missing[:3]}, unexpected {extra[:3]}" if missing or extra else "same tensors in another order")
        return f"{len(want)} tensors, in order"

    if run_check(report, "tensor names", COMPARED["tensor names"], names, GROUP).status == "PASS":
        with steps("verify gguf", len(plan)) as advance:
            run_check(report, "tensors", COMPARED["tensors"], _tensors(tensors, plan, advance), GROUP)
    run_check(report, "provenance", COMPARED["provenance"], _provenance(fields, source), GROUP)


def _outtype(tensors: dict[str, gguf.ReaderTensor], default_plan: list) -> str | None:
    """The --outtype OUT was written with: the type its unquantized 2-D tensors share when that
    is not what each would keep by default (None: the default)."""
    names = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
    found = {tensors[t.name].tensor_type.name for t in default_plan
             if t.name in tensors and len(t.byte_shape) > 1 and t.qtype.name in names}
    default = {t.qtype.name for t in default_plan if len(t.byte_shape) > 1 and t.qtype.name in names}
    if len(found) == 1 and found != default:
        return names[found.pop()]
    return None

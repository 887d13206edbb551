"""`w4 verify OUTPUT --against SOURCE`: a `w4 dequantize` or `w4 repack` output checked against a
fresh conversion of SOURCE with the CPU reference (deterministic), tensor by tensor, streamed:
at most one output tensor and the source layer that produces it are in memory at a time.

Rows: output files; config.json (expected = what the command writes for SOURCE); tensor names
(same set); tensors (bit for bit; for a repacked OUTPUT the int32 words directly, and both sides
dequantized to float32, where every (q - z) * s is exact); copied files (byte-identical); file
set (nothing in OUTPUT that a conversion of SOURCE does not write; the `*.py` files too when
OUTPUT records that it was made with --include-code); provenance (what OUTPUT's shards record of
their origin, consistent across shards and with the revision SOURCE resolves to).
"""

from __future__ import annotations

import filecmp
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from w4cli.read.checkpoint import CONFIG, INDEX, Checkpoint, open_checkpoint
from w4cli.write import provenance
from w4cli.gpu.checks import Mismatch, first_difference
from w4cli.dequantize import DTYPES, dense_config, reference, torch_dtype_name
from w4cli.read.hub import Snapshot
from w4cli.dequantize import plan_tensors as dequantize_plan
from w4cli.read.layers import QuantModel
from w4cli.formats.fuse import fusions_in
from w4cli.repack import check_repackable, fused_groups, repacked_config
from w4cli.repack import plan_tensors as repack_plan
from w4cli.read.source import aux_files, open_quantized
from w4cli.console import steps
from w4cli.verify.report import Report, run_check
from w4cli.write.writer import OutputTensor, plan_shards

GROUP = "compare"


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _config_differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(got) | set(want), key=str):
        if key not in got:
            out.append(f"'{key}' missing (expected {_describe(want[key])})")
        elif key not in want:
            out.append(f"'{key}' unexpected ({_describe(got[key])})")
        elif got[key] != want[key]:
            out.append(f"'{key}' is {_describe(got[key])}, expected {_describe(want[key])}")
    return out


def _weights_dtype(output: Checkpoint, source: QuantModel) -> str | None:
    """The dtype the dequantized linears were written in (None if none of them is present)."""
    for layer in source.layers.values():
        info = output.tensors.get(layer.weight)
        if info is not None:
            return torch_dtype_name(info.dtype)
    return None


def _config(output: Checkpoint, expected: dict[str, Any], tensor_dtype: str | None) -> Callable[[], str]:
    def body() -> str:
        diffs = _config_differences(output.config, expected)
        if diffs:
            raise Mismatch(f"{len(diffs)} keys differ from what w4 writes for SOURCE; {diffs[0]}")
        if tensor_dtype is not None:
            for key in ("dtype", "torch_dtype"):
                if key in output.config and output.config[key] != tensor_dtype:
                    raise Mismatch(f"config.json says {key} {output.config[key]!r} but the weights are {tensor_dtype}")
        return "as w4 writes it for SOURCE (every key)"

    return body


def _names(output: Checkpoint, plan: list[OutputTensor]) -> Callable[[], str]:
    def body() -> str:
        want = [t.name for t in plan]
        missing = [n for n in want if n not in output.tensors]
        extra = [n for n in output.tensors if n not in set(want)]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"{len(missing)} missing (first {missing[0]})")
            if extra:
                parts.append(f"{len(extra)} unexpected (first {extra[0]})")
            raise Mismatch("; ".join(parts))
        return f"the same {len(want)} tensor names"

    return body


def _tensors(output: Checkpoint, plan: list[OutputTensor], label: str, advance: Callable[[str], None]) -> Callable[[], str]:
    """Each OUTPUT tensor against the same tensor produced afresh from SOURCE, one at a time."""

    def body() -> str:
        failures, compared, nbytes = [], 0, 0
        for tensor in plan:
            if tensor.name in output.tensors:
                diff = first_difference(output.read_one(tensor.name), tensor.produce(), "output", "fresh")
                if diff is not None:
                    failures.append(f"{tensor.name}: {diff}")
                compared += 1
                nbytes += tensor.nbytes
            advance(tensor.name)
        if failures:
            raise Mismatch(f"{len(failures)} of {compared} tensors differ; {failures[0]}")
        if compared == 0:
            raise Mismatch("no tensor to compare")
        return f"{compared} tensors ({nbytes / 1e6:,.1f} MB) bit-identical to {label}"

    return body


def _both_dequantized(output_root: Path, source: QuantModel, advance: Callable[[str], None]) -> Callable[[], str]:
    def body() -> str:
        repacked = open_quantized(output_root)  # refused -> this row fails with the reason
        ours = {t.name: t for t in dequantize_plan(repacked, torch.float32, reference())}
        theirs = dequantize_plan(source, torch.float32, reference())
        failures = []
        for tensor in theirs:
            mine = ours.get(tensor.name)
            if mine is None:
                failures.append(f"{tensor.name}: missing after dequantizing OUTPUT")
            else:
                diff = first_difference(mine.produce(), tensor.produce(), "output", "source")
                if diff is not None:
                    failures.append(f"{tensor.name}: {diff}")
            advance(tensor.name)
        if failures:
            raise Mismatch(f"{len(failures)} of {len(theirs)} dequantized tensors differ; {failures[0]}")
        return f"{len(theirs)} tensors bit-identical after exact float32 dequantization of both sides"

    return body


def _provenance(output: Checkpoint, source: Snapshot) -> Callable[[], str]:
    def body() -> str:
        records = provenance.shard_records(output)
        if any(r != records[0] for r in records):
            raise Mismatch("OUTPUT's shards disagree on where they came from")
        recorded = records[0]
        if not recorded:
            return "OUTPUT's shards record no origin (not written by w4, or by an older one); the rows above decide"
        origin, revision = recorded.get(provenance.SOURCE, ""), recorded.get(provenance.REVISION, "")
        if source.repo_id is not None and origin == source.repo_id and revision and revision != source.revision:
            raise Mismatch(f"OUTPUT was made from {origin} at revision {revision}; SOURCE resolves to revision {source.revision}")
        at = f" at {revision[:12]}" if revision else ""
        return f"made from {origin}{at} by w4 {recorded.get(provenance.VERSION, '?')}: {recorded.get(provenance.COMMAND, '?')}"

    return body


def _copied_files(output_root: Path, source: QuantModel, include_code: bool) -> Callable[[], str]:
    def body() -> str:
        want = aux_files(source.checkpoint, include_code)
        problems = []
        for name in want:
            mine = output_root / name
            if not mine.is_file():
                problems.append(f"{name} is missing")
            elif not filecmp.cmp(mine, source.checkpoint.root / name, shallow=False):
                problems.append(f"{name} differs from SOURCE's")
        if problems:
            raise Mismatch(f"{len(problems)} files; {problems[0]}")
        return f"{len(want)} files byte-identical" + (f" ({', '.join(want)})" if want and len(want) <= 4 else "")

    return body


def _written_files(shard_count: int) -> set[str]:
    """The files a conversion writes itself when its tensors fill `shard_count` files: the shards
    and their index as the writer names them, and config.json. The shard limit is the user's
    choice, so the count comes from OUTPUT; planning that many one-byte stand-ins with a one-byte
    limit gives the writer's names for it."""
    stand_ins = [OutputTensor(str(i), (1,), torch.uint8, lambda: torch.zeros(1, dtype=torch.uint8), 0) for i in range(shard_count)]
    shards = plan_shards(stand_ins, max_shard_size=1, provenance={})
    return set(shards.files) | ({INDEX} if shards.index is not None else set()) | {CONFIG}


def _file_set(output_root: Path, output: Checkpoint, source: QuantModel, include_code: bool) -> Callable[[], str]:
    """A conversion writes nothing else: a pickle or a .py file beside the weights runs code in a
    loader that trusts it, and a stray weight file can shadow or extend the converted ones."""

    def body() -> str:
        written = _written_files(len(output.weight_files))
        want = written | set(aux_files(source.checkpoint, include_code))
        found = sorted(path.name for path in output_root.iterdir())
        unexpected = [name for name in found if name not in want]
        missing = sorted(written - set(found))  # a missing copied file is the copied files row's
        problems = []
        if unexpected:
            problems.append(f"{_files_count(unexpected)} a conversion of SOURCE does not write: {_listed(unexpected)}")
        if missing:
            problems.append(f"{_files_count(missing)} a conversion writes missing: {_listed(missing)}")
        if problems:
            raise Mismatch("; ".join(problems))
        return f"{len(found)} files, each one a conversion of SOURCE writes"

    return body


def _files_count(names: list[str]) -> str:
    return f"{len(names)} file{'s' if len(names) != 1 else ''}"


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


COMPARED = {
    "output files": "OUTPUT's safetensors headers and index",
    "config.json": "OUTPUT config vs what w4 writes for SOURCE; dtype vs the tensors",
    "tensor names": "OUTPUT tensor names vs a fresh conversion's",
    "tensors": "every OUTPUT tensor vs a fresh CPU conversion of SOURCE; raw bits",
    "repacked words": "every OUTPUT tensor (int32 words, scales, meta) vs a fresh repack of SOURCE; raw bits",
    "dequantized both sides": "OUTPUT and SOURCE dequantized to float32 (exact); raw bits",
    "copied files": "tokenizer, generation, model card and license files (and *.py with --include-code) vs SOURCE's, byte for byte",
    "file set": "OUTPUT's files vs what a conversion writes: shards, index, config.json, copied files",
    "provenance": "origin recorded in OUTPUT's shards: the same in every shard, SOURCE's revision",
}


def _is_repacked(output: Checkpoint) -> bool:
    qc = output.config.get("quantization_config")
    if isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "w4":
        return True
    return any(name.endswith(".qweight") for name in output.tensors)


def run(report: Report, output_root: Path, source_snapshot: Snapshot, include_code: bool) -> None:
    """include_code: OUTPUT records that it was made with --include-code (made_with_code)."""
    source = open_quantized(source_snapshot.path)  # InputRefused here: SOURCE refused (exit 4)
    found: dict[str, Checkpoint] = {}

    def opened() -> str:
        found["output"] = open_checkpoint(output_root)
        c = found["output"]
        return f"{len(c.tensors)} tensors in {len(c.weight_files)} files"

    if run_check(report, "output files", COMPARED["output files"], opened, GROUP).status != "PASS":
        return
    output = found["output"]

    if _is_repacked(output):
        report.target["output_kind"] = "repacked (w4-gemv)"
        check_repackable(source)  # SOURCE that `w4 repack` refuses is refused here too (exit 4)
        groups = fused_groups(source, fusions_in(output.config))  # repacked as OUTPUT says it was
        plan = repack_plan(source, groups)
        expected = repacked_config(source.checkpoint.config, source, groups)
        run_check(report, "config.json", COMPARED["config.json"], _config(output, expected, None), GROUP)
        run_check(report, "tensor names", COMPARED["tensor names"], _names(output, plan), GROUP)
        with steps("w4 verify: repacked tensors", 2 * len(plan)) as advance:
            run_check(report, "repacked words", COMPARED["repacked words"], _tensors(output, plan, "a fresh repack", advance), GROUP)
            run_check(report, "dequantized both sides", COMPARED["dequantized both sides"], _both_dequantized(output_root, source, advance), GROUP)
    else:
        tensor_dtype = _weights_dtype(output, source)
        named = output.config.get("dtype", output.config.get("torch_dtype"))
        written = named if named in DTYPES else (tensor_dtype if tensor_dtype in DTYPES else "float16")
        report.target["output_kind"] = f"dequantized ({written})"
        plan = dequantize_plan(source, DTYPES[written], reference())
        expected = dense_config(source.checkpoint.config, written)
        run_check(report, "config.json", COMPARED["config.json"], _config(output, expected, tensor_dtype), GROUP)
        run_check(report, "tensor names", COMPARED["tensor names"], _names(output, plan), GROUP)
        with steps("w4 verify: tensors", len(plan)) as advance:
            run_check(report, "tensors", COMPARED["tensors"], _tensors(output, plan, f"a fresh {written} dequantization", advance), GROUP)
    run_check(report, "copied files", COMPARED["copied files"], _copied_files(output_root, source, include_code), GROUP)
    run_check(report, "file set", COMPARED["file set"], _file_set(output_root, output, source, include_code), GROUP)
    run_check(report, "provenance", COMPARED["provenance"], _provenance(output, source_snapshot), GROUP)

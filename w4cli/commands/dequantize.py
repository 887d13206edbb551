"""`w4 dequantize MODEL OUTPUT_DIR`: an AWQ checkpoint becomes a plain fp16/bf16/fp32 one."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.table import Table

from w4cli import console
from w4cli.convert import ConversionReport, write_checkpoint
from w4cli.dequantize import DTYPES, Dequantizer, cpu_dequantizer, dense_config, plan_tensors
from w4cli.errors import EnvironmentUnavailable
from w4cli.options import (
    CacheDirOpt,
    Device,
    DeviceOpt,
    Dtype,
    DtypeOpt,
    ForceOpt,
    JsonOpt,
    MaxShardSizeOpt,
    ModelArg,
    OutputDirArg,
    RevisionOpt,
    TokenOpt,
)
from w4cli.source import aux_files, open_awq, resolve
from w4cli.writer import check_output_dir, parse_size

EXAMPLES = """
Examples:

  w4 dequantize Qwen/Qwen2.5-7B-Instruct-AWQ ./qwen2.5-7b-bf16 --dtype bfloat16

  w4 dequantize ./my-awq-model ./my-model-fp16 --max-shard-size 2GB --json
"""


def _cuda_dequantizer(kernels) -> Dequantizer:
    def run(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        out = kernels.dequantize_awq(qweight.cuda(), qzeros.cuda(), scales.cuda(), dtype=dtype, transpose=True)
        return out.cpu()

    return run


def select_dequantizer(device: Device) -> tuple[str, Dequantizer]:
    """The GPU kernel when asked for or when auto finds it usable; the CPU reference otherwise."""
    if device is Device.cpu:
        return "cpu", cpu_dequantizer
    from w4cli import kernels

    usable, reason = kernels.available()
    if usable:
        try:
            kernels.load()
            return "cuda", _cuda_dequantizer(kernels)
        except EnvironmentUnavailable as exc:
            if device is Device.cuda:
                raise
            reason = str(exc)
    elif device is Device.cuda:
        raise EnvironmentUnavailable(reason)
    console.note(f"note: {reason}; dequantizing with the CPU reference (--device cpu silences this)")
    return "cpu", cpu_dequantizer


def _render(report: ConversionReport, layers: int, copied: int, backend: str, dtype: str, as_json: bool) -> None:
    summary = {
        "output": str(report.output),
        "dtype": dtype,
        "device": backend,
        "layers_dequantized": layers,
        "tensors_copied": copied,
        "files": report.files,
        "bytes_in": report.bytes_in,
        "bytes_out": report.bytes_out,
        "seconds": round(report.seconds, 3),
        "mb_per_s": round(report.mb_per_s, 1),
    }
    if as_json:
        console.emit_json(summary)
        return
    table = Table(title="w4 dequantize", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("layers dequantized", str(layers))
    table.add_row("tensors copied", str(copied))
    table.add_row("device", backend)
    table.add_row("dtype", dtype)
    table.add_row("bytes in", f"{report.bytes_in / 1e6:,.1f} MB")
    table.add_row("bytes out", f"{report.bytes_out / 1e6:,.1f} MB")
    table.add_row("seconds", f"{report.seconds:.2f}")
    table.add_row("throughput", f"{report.mb_per_s:,.1f} MB/s written")
    table.add_row("output", str(report.output))
    console.stdout.print(table)


@console.boundary
def dequantize(
    model: ModelArg,
    output_dir: OutputDirArg,
    dtype: DtypeOpt = Dtype.float16,
    device: DeviceOpt = Device.auto,
    max_shard_size: MaxShardSizeOpt = "5GB",
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    cache_dir: CacheDirOpt = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Turn an AWQ (gemm) checkpoint into an ordinary fp16/bf16/fp32 Hugging Face checkpoint.

    Every quantized linear becomes PREFIX.weight (out_features x in_features) = (q - z) * s, rounded once to --dtype and bit-identical to AutoAWQ's reference dequantization. Other tensors are cast, tokenizer and generation files copied, and the output directory appears only when complete.
    """
    shard_bytes = parse_size(max_shard_size)
    check_output_dir(output_dir, [Path(model)] if Path(model).is_dir() else [], force)
    snapshot = resolve(model, revision, token, cache_dir)
    check_output_dir(output_dir, [snapshot.path], force)
    awq = open_awq(snapshot.path)
    backend, dequantizer = select_dequantizer(device)
    tensors = plan_tensors(awq, DTYPES[dtype.value], dequantizer)
    report = write_checkpoint(
        awq.checkpoint,
        output_dir,
        tensors,
        dense_config(awq.checkpoint.config, dtype.value),
        aux_files(awq.checkpoint),
        shard_bytes,
        label=f"dequantize ({backend})",
    )
    copied = len(tensors) - len(awq.layers)
    _render(report, len(awq.layers), copied, backend, dtype.value, as_json)


dequantize.__doc__ = (dequantize.__doc__ or "") + EXAMPLES

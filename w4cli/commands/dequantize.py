"""`w4 dequantize MODEL OUTPUT_DIR`: an AWQ, GPTQ or compressed-tensors checkpoint becomes a plain
fp16/bf16/fp32 one."""

from __future__ import annotations

import typer

from w4cli import console
from w4cli.options import (
    CacheDirOpt,
    Device,
    DeviceOpt,
    DtypeOpt,
    ForceOpt,
    IncludeCodeOpt,
    JsonOpt,
    MaxShardSizeOpt,
    ModelArg,
    OutputDirArg,
    RevisionOpt,
    TokenOpt,
)

EXAMPLES = [
    "w4 dequantize Qwen/Qwen2.5-7B-Instruct-AWQ ./qwen2.5-7b-bf16 --dtype bf16",
    "w4 dequantize ./my-awq-model ./my-model --dtype auto",
    "w4 dequantize ./my-gptq-model ./my-model             # GPTQ, compressed-tensors: auto by default",
    "w4 dequantize ./my-awq-model ./my-model-fp16 --max-shard-size 2GB --json -",
]


@console.boundary
def dequantize(
    ctx: typer.Context,
    model: ModelArg,
    output_dir: OutputDirArg,
    dtype: DtypeOpt = None,
    device: DeviceOpt = Device.auto,
    max_shard_size: MaxShardSizeOpt = "5GB",
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    cache_dir: CacheDirOpt = None,
    force: ForceOpt = False,
    include_code: IncludeCodeOpt = False,
    json_file: JsonOpt = None,
) -> None:
    """Turn an AWQ (gemm), GPTQ, compressed-tensors (pack-quantized) or w4-repacked checkpoint into an ordinary fp16/bf16/fp32 Hugging Face checkpoint.

    Every quantized linear becomes PREFIX.weight (out_features x in_features) = (q - z) * s, rounded once to --dtype; in the scales' dtype (--dtype auto, the default for GPTQ and compressed-tensors; float16 for AWQ) it is bit-identical to the format's own library. Other tensors are cast, tokenizer and generation files copied, and the output directory appears only when complete.
    """
    from w4cli.dequantize import DTYPES, choose_dtype, dense_config, plan_tensors, select_dequantizer
    from w4cli.read.source import files_to_copy
    from w4cli.write.output_dir import open_for_conversion
    from w4cli.write.writer import parse_size, write_checkpoint

    shard_bytes = parse_size(max_shard_size)
    awq, output, origin = open_for_conversion(ctx, model, output_dir, force, revision, token, cache_dir, include_code)
    dtype_name, dtype_from = choose_dtype(dtype.value if dtype is not None else None, awq)
    backend, dequantizer = select_dequantizer(device.value)
    console.record(quantized_layers=len(awq.layers), dtype=dtype_name, device=backend)
    tensors = plan_tensors(awq, DTYPES[dtype_name], dequantizer)
    report = write_checkpoint(
        awq.checkpoint,
        output,
        tensors,
        dense_config(awq.checkpoint.config, dtype_name),
        files_to_copy(awq.checkpoint, include_code),
        shard_bytes,
        label=f"dequantize ({backend})",
        provenance=origin,
    )
    summary = {
        "dtype": dtype_name,
        "dtype_from": dtype_from,
        "device": backend,
        "layers_dequantized": len(awq.layers),
        "tensors_copied": len(tensors) - len(awq.layers),
        **report.fields(),
        "provenance": origin,
    }
    console.result(summary, json_file, lambda: console.summary_table("w4 dequantize", summary))

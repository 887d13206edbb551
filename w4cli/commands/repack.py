"""`w4 repack MODEL OUTPUT_DIR`: an AWQ checkpoint in w4's GEMV layout, offline and lossless."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from w4cli import console
from w4cli.options import CacheDirOpt, ForceOpt, IncludeCodeOpt, JsonOpt, MaxShardSizeOpt, ModelArg, OutputDirArg, RevisionOpt, TokenOpt

EXAMPLES = [
    "w4 repack Qwen/Qwen2.5-7B-Instruct-AWQ ./qwen2.5-7b-w4",
    "w4 repack ./my-awq-model ./my-model-w4 --max-shard-size 2GB --json repack.json",
    "w4 repack ./my-awq-model ./my-model-w4-fused --fuse qkv,gate_up",
]


@console.boundary
def repack(
    ctx: typer.Context,
    model: ModelArg,
    output_dir: OutputDirArg,
    max_shard_size: MaxShardSizeOpt = "5GB",
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    cache_dir: CacheDirOpt = None,
    force: ForceOpt = False,
    include_code: IncludeCodeOpt = False,
    fuse: Annotated[
        Optional[str],
        typer.Option(
            "--fuse",
            help="Write fused linears, as serving engines load them: qkv (q/k/v_proj as one qkv_proj), gate_up "
            "(gate/up_proj as one gate_up_proj), comma-separated. Dequantize and verify split them back.",
        ),
    ] = None,
    json_file: JsonOpt = None,
) -> None:
    """Rewrite an AWQ (gemm) checkpoint in w4's GEMV layout (w4-gemv v1): int4 codes packed along K with the [0,2,4,6,1,3,5,7] nibble interleave, tiled for 16-byte loads.

    Lossless: dequantizing the output gives bit-for-bit the weights of the input. Other tensors and the tokenizer files are copied unchanged; config.json names the layout, so every w4 command reads the result.
    """
    from w4cli.formats.fuse import parse_fuse
    from w4cli.repack import check_repackable, fused_groups, plan_tensors, repacked_config
    from w4cli.read.source import files_to_copy
    from w4cli.write.output_dir import open_for_conversion
    from w4cli.write.writer import parse_size, write_checkpoint

    shard_bytes = parse_size(max_shard_size)
    fusions = parse_fuse(fuse)
    quantized, output, origin = open_for_conversion(ctx, model, output_dir, force, revision, token, cache_dir, include_code)
    check_repackable(quantized)
    groups = fused_groups(quantized, fusions)
    console.record(quantized_layers=len(quantized.layers))
    tensors = plan_tensors(quantized, groups)
    report = write_checkpoint(
        quantized.checkpoint,
        output,
        tensors,
        repacked_config(quantized.checkpoint.config, quantized, groups),
        files_to_copy(quantized.checkpoint, include_code),
        shard_bytes,
        label="repack",
        provenance=origin,
    )
    summary = {
        "layout": "w4-gemv",
        "layers_repacked": len(quantized.layers),
        "layers_fused": sum(len(group.parts) for group in groups),
        "fused_linears": len(groups),
        "tensors_written": report.tensors,
        **report.fields(),
        "provenance": origin,
    }
    console.result(summary, json_file, lambda: console.summary_table("w4 repack", summary))

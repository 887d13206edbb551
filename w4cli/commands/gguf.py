"""`w4 gguf MODEL OUT.gguf`: an AWQ, GPTQ or compressed-tensors checkpoint as a GGUF file for
llama.cpp and Ollama, its int4 codes kept as they are (docs/formats.md, GGUF)."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from w4cli import console
from w4cli.errors import UsageError
from w4cli.options import CacheDirOpt, JsonOpt, ModelArg, RevisionOpt, TokenOpt, not_empty

EXAMPLES = [
    "w4 gguf Qwen/Qwen2.5-7B-Instruct-AWQ qwen2.5-7b-instruct.gguf",
    "w4 gguf ./my-gptq-model my-model.gguf --outtype f16",
    "w4 gguf ./my-awq-model my-model.gguf --split-max-size 4G --json -",
]


class OutType(str, Enum):
    auto = "auto"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"


OutArg = Annotated[
    Path,
    typer.Argument(help="GGUF file to write; must not exist (see --force).", show_default=False, metavar="OUT.gguf",
                   parser=lambda text: Path(not_empty(text))),
]
OutTypeOpt = Annotated[
    OutType,
    typer.Option("--outtype", help="dtype of the unquantized 2-D tensors (embeddings, an unquantized lm_head); auto keeps "
                 "each one's own. 1-D tensors and norms are always f32, as llama.cpp takes them."),
]
SplitOpt = Annotated[
    str,
    typer.Option("--split-max-size", help="Largest file, as llama.cpp's gguf-split takes it (500M, 4G; decimal units); "
                 "0: one file. Parts are named OUT-00001-of-0000N.gguf."),
]

ForceOpt = Annotated[
    bool, typer.Option("--force", help="Replace an existing OUT, only if it is a GGUF file (atomically, once the new one is complete).")
]

_SIZE = re.compile(r"([0-9]+)([KMG]?)B?", re.IGNORECASE)


def parse_split_size(text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"--split-max-size '{text}' is not a size like 500M or 4G")
    return int(match.group(1)) * 1000 ** "_KMG".index(match.group(2).upper() or "_")


@console.boundary
def gguf(
    ctx: typer.Context,
    model: ModelArg,
    out: OutArg,
    outtype: OutTypeOpt = OutType.auto,
    split_max_size: SplitOpt = "0",
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    cache_dir: CacheDirOpt = None,
    force: ForceOpt = False,
    json_file: JsonOpt = None,
) -> None:
    """Write an AWQ (gemm), GPTQ or compressed-tensors (pack-quantized) checkpoint as a GGUF file for llama.cpp and Ollama, with no second quantization.

    Every quantized linear becomes GGUF 4-bit blocks holding its own codes: Q4_0 (d = s) when its zero points are 8, else Q4_1 (d = s, m = -z * s rounded once to fp16). Act-order, groups or in_features not a multiple of 32, scales fp16 cannot hold and unknown architectures are refused (exit 4) before anything is written. The file appears only when complete.
    """
    from w4cli.write import provenance
    from w4cli.gguf.arch import architecture
    from w4cli.gguf.output_file import OutputFile, check_output_file
    from w4cli.gguf.plan import plan_tensors
    from w4cli.gguf.write import write_gguf
    from w4cli.read.source import open_quantized, resolve

    split_bytes = parse_split_size(split_max_size)
    check_output_file(out, [Path(model)] if Path(model).is_dir() else [])
    output = ctx.with_resource(OutputFile(out, force))
    snapshot = resolve(model, revision, token, cache_dir, check_config=architecture)  # before the download
    check_output_file(out, [snapshot.path])
    quantized = open_quantized(snapshot.path)
    arch = architecture(quantized.checkpoint.config)
    tensors = plan_tensors(quantized, arch, None if outtype == OutType.auto else outtype.value)
    blocks = sorted({t.qtype.name for t in tensors if t.qtype.name.startswith("Q4")})
    console.record(architecture=arch.name, block_types=blocks)
    name = snapshot.repo_id or snapshot.path.name
    origin = provenance.record(ctx, snapshot)
    report = write_gguf(quantized, arch, tensors, output, name, snapshot.repo_id, origin, split_bytes)
    summary = {
        "architecture": arch.name,
        "block_types": blocks,
        "layers_quantized": sum(1 for t in tensors if t.qtype.name.startswith("Q4")),
        **report.fields(),
        "provenance": origin,
    }
    console.result(summary, json_file, lambda: console.summary_table("w4 gguf", summary))

"""Option types shared by the subcommands, spelled the way `hf download` spells them."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

ModelArg = Annotated[str, typer.Argument(help="Hub repo id (org/name) or a local checkpoint directory.", show_default=False)]
OutputDirArg = Annotated[Path, typer.Argument(help="Directory to write; must be empty or absent (see --force).", show_default=False)]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Hub branch, tag or commit.")]
TokenOpt = Annotated[
    Optional[str], typer.Option("--token", help="Hub token; defaults to HF_TOKEN or the saved login.", show_default=False)
]
CacheDirOpt = Annotated[
    Optional[Path], typer.Option("--cache-dir", help="Hub cache directory (default: HF_HUB_CACHE or ~/.cache/huggingface/hub).")
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Replace an OUTPUT_DIR that holds a checkpoint (atomically, once the new one is complete).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")]
MaxShardSizeOpt = Annotated[
    str, typer.Option("--max-shard-size", help="Largest output shard, decimal units as on the Hub (5GB, 500MB).")
]


class Dtype(str, Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Output dtype; (q - z) * s is rounded once to it.")]
DeviceOpt = Annotated[
    Device, typer.Option("--device", help="auto: w4's CUDA kernel when a GPU is usable, else the CPU reference.")
]

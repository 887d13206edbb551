"""Option types shared by the subcommands, spelled the way `hf download` spells them. A value the
parser rejects is a usage error (cli.py prints it as one `error:` line, exit 2)."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


def not_empty(text: str) -> str:
    # an empty MODEL or OUTPUT_DIR would silently mean the current directory
    if not text:
        raise typer.BadParameter("must not be empty")
    return text


def _output_dir(text: str) -> Path:
    return Path(not_empty(text))


def writable_file(text: str) -> Path:
    """FILE of --json / --junit ('-': stdout), checked before any work, so a run of minutes cannot
    end unable to write its report."""
    path = Path(not_empty(text))
    if text == "-":
        return path
    try:
        if path.is_dir():
            raise typer.BadParameter(f"cannot write {text}: it is a directory")
        if path.exists():
            # opened without truncating, and written nothing: that is enough to find a read-only
            # file or a device that refuses writes (/dev/full), and changes no file; O_NONBLOCK so
            # a FIFO without a reader is refused instead of waited on
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            try:
                os.write(fd, b"")
            finally:
                os.close(fd)
        elif not path.parent.is_dir():
            raise typer.BadParameter(f"cannot write {text}: {path.parent} is not a directory")
        elif not os.access(path.parent, os.W_OK | os.X_OK):
            raise typer.BadParameter(f"cannot write {text}: {path.parent} is not writable")
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {text}: {exc.strerror or exc}") from None
    return path


# seeds go to torch.Generator.manual_seed, offset by a layer's index
SEED_MAX = 2**32 - 1


ModelArg = Annotated[
    str,
    typer.Argument(help="Hub repo id (org/name) or a local checkpoint directory.", show_default=False, metavar="MODEL",
                   parser=not_empty),
]
OutputDirArg = Annotated[
    Path,
    typer.Argument(help="Directory to write; must be empty or absent (see --force).", show_default=False,
                   metavar="OUTPUT_DIR", parser=_output_dir),
]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Hub branch, tag or commit.")]
TokenOpt = Annotated[
    Optional[str], typer.Option("--token", help="Hub token; defaults to HF_TOKEN or the saved login.", show_default=False)
]
CacheDirOpt = Annotated[
    Optional[Path], typer.Option("--cache-dir", help="Hub cache directory (default: HF_HUB_CACHE or ~/.cache/huggingface/hub).")
]
IncludeCodeOpt = Annotated[
    bool,
    typer.Option(
        "--include-code",
        help="Also copy the checkpoint's *.py files (custom code named by config.json's auto_map) verbatim; w4 never imports or runs them.",
    ),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Replace an OUTPUT_DIR that holds a checkpoint (atomically, once the new one is complete).")
]
JsonOpt = Annotated[
    Optional[Path],
    typer.Option("--json", help="Also write the result as one JSON document to FILE ('-': on stdout, instead of the tables).",
                 show_default=False, metavar="FILE", parser=writable_file),
]
MaxShardSizeOpt = Annotated[
    str, typer.Option("--max-shard-size", help="Largest output shard, decimal units as on the Hub (5GB, 500MB).")
]


class Dtype(str, Enum):
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"
    auto = "auto"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


DtypeOpt = Annotated[
    Dtype,
    typer.Option(
        "--dtype",
        help="Output dtype; (q - z) * s is rounded once to it. fp16, bf16, fp32 are short for float16, bfloat16, "
        "float32; auto is the checkpoint's own: its scales' dtype, else config.json's. Default: float16 for AWQ, "
        "auto for GPTQ and compressed-tensors.",
    ),
]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option("--threads", min=1, show_default=False,
                 help="CPU threads that dequantize (default: every core w4 may run on)."),
]
DeviceOpt = Annotated[
    Device, typer.Option("--device", help="auto: w4's CUDA kernel when a GPU is usable, else w4's CPU kernel.")
]

"""Where an output checkpoint came from, written into every shard's safetensors metadata (beside
transformers' `format: pt`) and into `--json`, so a file found on its own still says what made it
and `w4 verify OUT --against SOURCE` can tell whether SOURCE is what it was made from.

safetensors metadata holds strings only; the command line is rebuilt from the parsed arguments,
never from argv, so a `--token` never reaches a file.
"""

from __future__ import annotations

import shlex
from enum import Enum
from pathlib import Path

from w4cli import __version__
from w4cli.read.hub import Snapshot

SOURCE = "w4_source"
REVISION = "w4_source_revision"
VERSION = "w4_version"
COMMAND = "w4_command"
SECRET_PARAMS = {"token"}


def command_line(ctx) -> str:
    """`w4 COMMAND ARGS...` as the running command (its typer.Context) parsed them, secrets left
    out; options at their default are left out too."""
    words = ["w4", ctx.info_name or ""]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name in SECRET_PARAMS or value is None or value is False:
            continue
        value = value.value if isinstance(value, Enum) else value
        if param.param_type_name == "argument":
            words.append(str(value))
        elif getattr(param, "is_flag", False):
            words.append(param.opts[0])
        elif value != param.default:
            words += [param.opts[0], str(value)]
    return shlex.join(words)


def record(ctx, snapshot: Snapshot) -> dict[str, str]:
    return {
        SOURCE: snapshot.repo_id or str(snapshot.path),
        REVISION: snapshot.revision or "",
        VERSION: __version__,
        COMMAND: command_line(ctx),
    }


def read(directory: Path) -> dict[str, str]:
    """What the checkpoint at `directory` records of its origin: the w4_* metadata its shards agree
    on; {} when they record nothing, disagree, or the directory is not a checkpoint w4 can open."""
    from w4cli.read.checkpoint import open_checkpoint
    from w4cli.errors import W4Error

    try:
        checkpoint = open_checkpoint(directory)
    except W4Error:
        return {}
    records = shard_records(checkpoint)
    checkpoint.close()
    return records[0] if records and all(r == records[0] for r in records) else {}


def shard_records(checkpoint) -> list[dict[str, str]]:
    """Each weight file's w4_* metadata."""
    return [{k: v for k, v in meta.items() if k.startswith("w4_")} for meta in checkpoint.file_metadata.values()]


def made_with_code(record: dict[str, str]) -> bool:
    """Whether the recorded command copied the checkpoint's *.py files (--include-code)."""
    return "--include-code" in shlex.split(record.get(COMMAND, ""))

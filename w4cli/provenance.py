"""Where an output checkpoint came from, written into every shard's safetensors metadata (beside
transformers' `format: pt`) and into `--json`, so a file found on its own still says what made it
and `w4 verify OUT --against SOURCE` can tell whether SOURCE is what it was made from.

safetensors metadata holds strings only; the command line is rebuilt from the parsed arguments,
never from argv, so a `--token` never reaches a file.
"""

from __future__ import annotations

import shlex
from enum import Enum

from w4cli import __version__
from w4cli.hub import Snapshot

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

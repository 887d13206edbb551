"""The `w4` command: registers the subcommands. Every command runs inside console.boundary, so a
failure is one line on stderr and an exit code from docs/cli.md; W4_DEBUG=1 shows the traceback.

Importing this module imports no torch, safetensors or huggingface_hub: `w4 --help` and
`w4 --version` answer at once, and each command imports what it needs when it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from w4cli import __version__, console
from w4cli.commands import bench, dequantize, gemv, gguf, repack, verify
from w4cli.errors import EXIT_USAGE


class _OneLineErrors(TyperGroup):
    """Usage errors found while parsing (an unknown option, a bad choice, a missing argument) as one
    `error:` line and exit 2, as every other failure, instead of Typer's boxed usage message. It sits
    in the command itself, so the console script and an in-process CliRunner behave the same."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        from typer._click.exceptions import ClickException, NoArgsIsHelpError

        args = list(sys.argv[1:] if args is None else args)
        try:
            outcome = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError:
            outcome = EXIT_USAGE  # the help is already printed
        except ClickException as exc:
            outcome = _usage_error(exc, args)
        if not standalone_mode:
            return outcome
        sys.exit(outcome if isinstance(outcome, int) else 0)


def _usage_error(exc: Any, args: list[str]) -> int:
    # Typer checks choices and ranges through pydantic, which prefixes the reason with its own
    # exception kind ("Invalid value for '--dtype': Value error, 'int8' is not one of ...")
    message = " ".join(exc.format_message().replace("Value error, ", "").split())
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f" (see {ctx.command_path} --help)"
    console.error_line(message)
    if ctx is not None and _wants_json_on_stdout(ctx.command, args):
        console.emit_json({"command": ctx.command.name, "ok": False, "error": message, "exit_code": exc.exit_code, "done": {}})
    return exc.exit_code


def _wants_json_on_stdout(command: Any, args: list[str]) -> bool:
    """Whether the refused command line asked for `--json -`. The options were not parsed, so this
    reads the words. A FILE gets nothing: it may be the very value that was refused."""
    if not any("--json" in getattr(p, "opts", []) for p in getattr(command, "params", [])):
        return False
    return "--json=-" in args or any(word == "--json" and args[i + 1 : i + 2] == ["-"] for i, word in enumerate(args))


app = typer.Typer(
    name="w4",
    cls=_OneLineErrors,
    help="int4 (W4A16, AWQ) checkpoints: dequantize, repack, GEMV kernel, benchmarks, verification.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    # never print locals: a traceback could show an HF token
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"w4 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """int4 (W4A16, AWQ) checkpoints: correct to the bit, as fast as the GPU allows."""


def _examples(lines: list[str]) -> str:
    """The end of a command's --help: its module's EXAMPLES, one command line each (no markup)."""
    return "Examples:\n\n" + "\n\n".join(escape(line) for line in lines)


app.command("dequantize", epilog=_examples(dequantize.EXAMPLES))(dequantize.dequantize)
app.command("repack", epilog=_examples(repack.EXAMPLES))(repack.repack)
app.command("gguf", epilog=_examples(gguf.EXAMPLES))(gguf.gguf)
app.command("gemv", epilog=_examples(gemv.EXAMPLES))(gemv.gemv)
app.command("bench", epilog=_examples(bench.EXAMPLES))(bench.bench)
app.command("verify", epilog=_examples(verify.EXAMPLES))(verify.verify)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""The `w4` command: registers the subcommands. Every command runs inside console.boundary, so a
failure is one line on stderr and an exit code from docs/cli.md; W4_DEBUG=1 shows the traceback."""

from __future__ import annotations

import typer

from w4cli import __version__
from w4cli.commands.bench import bench
from w4cli.commands.dequantize import dequantize
from w4cli.commands.gemv import gemv
from w4cli.commands.repack import repack
from w4cli.commands.verify import verify

app = typer.Typer(
    name="w4",
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


app.command("dequantize")(dequantize)
app.command("repack")(repack)
app.command("gemv")(gemv)
app.command("bench")(bench)
app.command("verify")(verify)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

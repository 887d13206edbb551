"""The `w4` console script (and `python -m w4cli`).

Stop signals are handled before the command line module is imported, because importing it (typer,
rich, torch) takes seconds: a Ctrl-C, SIGTERM or SIGHUP then is one `error: interrupted` line and
exit 130, never a Python traceback.
"""

from __future__ import annotations

import sys

from w4cli.write import signals
from w4cli.errors import EXIT_INTERRUPTED


def main() -> None:
    signals.install()
    try:
        from w4cli.cli import main as run

        run()
    except KeyboardInterrupt:
        # an interrupt while the command line is imported or set up; commands report their own
        sys.stderr.write("error: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    finally:
        signals.quiet()

"""The `w4` console script (and `python -m w4cli`).

Stop signals are handled before the command line module is imported, because importing it (typer,
rich, torch) takes seconds: a Ctrl-C, SIGTERM or SIGHUP then is one `error: interrupted` line and
exit 130, never a Python traceback.

OpenMP's idle workers sleep instead of spinning (OMP_WAIT_POLICY, unless the user set it), which
must be decided before torch loads its OpenMP runtime: `w4 dequantize` alternates short torch ops
with a writer and a reader thread, and spinning workers took the cores those threads need
(dev/LOG.md, CPU dequantize).
"""

from __future__ import annotations

import os
import sys

from w4cli.write import signals
from w4cli.errors import EXIT_INTERRUPTED


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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

"""Stop requests: SIGTERM (a cancelled CI job) and SIGHUP (a closed terminal) stop w4 the way
Ctrl-C does, by raising KeyboardInterrupt in the main thread, so one clean-up path serves all three.

Standard library only: the entry point installs the handlers before anything slow is imported.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def install() -> None:
    """TERM and HUP raise KeyboardInterrupt like INT. A signal the parent set to be ignored stays
    ignored (`nohup w4 ...` must survive the hangup)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _interrupt)


@contextmanager
def deferred(redeliver: bool = True) -> Iterator[None]:
    """Hold stop requests while the body runs, for steps that must not stop half-way (a rename and
    the record of it, the removal of a temporary directory). With `redeliver`, a request that
    came meanwhile takes effect when the body ends, as its handler would have; without, it is
    dropped. Handlers can only change on the main thread; elsewhere this holds nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    # None: a handler installed outside Python, which Python cannot put back
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    previous = {signum: handler for signum, handler in previous.items() if handler not in (signal.SIG_IGN, None)}
    for signum in previous:
        signal.signal(signum, lambda received, frame: pending.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending and redeliver:
            signal.raise_signal(pending[0])

"""Stop requests: SIGINT (Ctrl-C), SIGTERM (a cancelled CI job) and SIGHUP (a closed terminal) all
raise KeyboardInterrupt in the main thread, so one clean-up path serves the three.

A KeyboardInterrupt can surface between any two bytecodes of the main thread, including inside
the pure-Python locks of `threading.Condition` and `queue.Queue`, where it can leave a lock held
or a wake-up lost and the process waiting forever. Code that must not stop half-way, or that
waits on such a lock, runs inside `held()`: one handler serves every stop signal and only records
the request while a hold is open, so opening and closing a hold is a counter, never a handler
swap that a signal could land in the middle of.

Standard library only: the entry point installs the handler before anything slow is imported.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_depth = 0  # open holds on the main thread
_pending: list[int] = []  # stop signals received while held, oldest first


def _on_stop(signum, frame) -> None:
    if _depth:
        _pending.append(signum)
        return
    _pending.clear()  # requests a hold recorded and then lost the race to this one
    raise KeyboardInterrupt


def install() -> None:
    """Route every stop signal to `_on_stop`. A signal the parent set to be ignored stays ignored
    (`nohup w4 ...` must survive the hangup; a background job of a shell ignores Ctrl-C)."""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _on_stop)


@contextmanager
def held(redeliver: bool = True) -> Iterator[None]:
    """Hold stop requests while the body runs. With `redeliver`, a request that came meanwhile
    raises KeyboardInterrupt when the outermost hold ends, as it would have on arrival; without,
    the requests that came during this hold are dropped (a clean-up that is ending the run
    anyway). Signals are handled on the main thread only, so elsewhere this holds nothing."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    start = len(_pending)
    _depth += 1
    try:
        yield
    finally:
        if not redeliver:
            del _pending[start:]
        _depth -= 1
        if not _depth and _pending:
            _pending.clear()
            raise KeyboardInterrupt


def quiet() -> None:
    """From now on a stop request is dropped: the command has finished and reported, and an
    interrupt during the interpreter's own shutdown would only print a traceback."""
    global _depth
    _depth += 1

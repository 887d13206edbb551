"""Stop signals held and released (w4cli/write/signals.py), and the writer's hand-over to its thread
when a stop signal lands inside it."""

from __future__ import annotations

import os
import queue
import signal
import time

import pytest

from w4cli.write import signals
from w4cli.write.writer import _Writer


@pytest.fixture
def stop_handler():
    """w4's handler on every stop signal for the test's duration, the previous ones put back (each
    set to its default first: install() keeps a signal ignored, as a suite run under nohup or as a
    background job would have them)."""
    previous = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signals.install()
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def deliver(signum: int) -> None:
    """Send `signum` to this process and let the main thread run its handler."""
    os.kill(os.getpid(), signum)
    for _ in range(100):  # a few bytecodes: the handler runs at the next check
        pass


def test_a_request_during_a_hold_is_raised_once_when_the_outermost_hold_ends(stop_handler):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals.held():
            with signals.held():
                deliver(signal.SIGTERM)
                deliver(signal.SIGHUP)
                reached.append("inner")
            reached.append("outer")
    assert reached == ["inner", "outer"]
    with signals.held():  # nothing left over from the two requests
        pass


def test_a_hold_without_redelivery_drops_only_its_own_requests(stop_handler):
    with signals.held(redeliver=False):
        deliver(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with signals.held():
            deliver(signal.SIGTERM)
            with signals.held(redeliver=False):
                deliver(signal.SIGHUP)
            # the outer request stands


def test_outside_a_hold_a_request_raises_at_once(stop_handler):
    with pytest.raises(KeyboardInterrupt):
        deliver(signal.SIGHUP)


class SignalledQueue(queue.Queue):
    """A queue that receives a stop signal while it holds its lock, the item stored and the
    waiting reader not yet woken: where a KeyboardInterrupt would lose the wake-up."""

    def _put(self, item):
        super()._put(item)
        deliver(signal.SIGTERM)


def test_a_stop_signal_inside_a_hand_over_is_raised_after_the_writer_is_woken(stop_handler, tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(queue, "Queue", SignalledQueue)
        writer = _Writer()
    time.sleep(0.1)  # the writer thread waits on the queue
    with open(tmp_path / "shard", "wb") as handle:
        with pytest.raises(KeyboardInterrupt):
            writer.put(handle, b"x")
        deadline = time.monotonic() + 10
        while handle.tell() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handle.tell() == 1, "the writer thread was never woken for the chunk"
        with pytest.raises(KeyboardInterrupt):
            writer.finish()  # the clean-up's hand-over, signalled the same way
    writer._thread.join(timeout=10)
    assert not writer._thread.is_alive(), "the writer thread never got its stop request"

"""Stopping by signal: SIGTERM and SIGHUP end a command like Ctrl-C, so its cleanup runs for every kind of
stop (standard library only: every command enters this before importing its work)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # stop like Ctrl-C (which raises KeyboardInterrupt itself)


def stop_interrupt(signum: int) -> KeyboardInterrupt:
    """The KeyboardInterrupt a stop by signal SIGNUM ends in ('stopped by SIGTERM')."""
    return KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, STOP_SIGNALS stop the process like Ctrl-C (stop_interrupt), so that the code's
    cleanup (finalizing a summary) runs for every kind of stop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise stop_interrupt(signum)

    old = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)

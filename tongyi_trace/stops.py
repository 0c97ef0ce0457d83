"""Stopping by signal: SIGTERM and SIGHUP end a command like Ctrl-C, so its cleanup runs for every kind of
stop (standard library only: every command enters this before importing its work)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # stop like Ctrl-C (which raises KeyboardInterrupt itself)


_REASON_PREFIX = "stopped by "


def stop_interrupt(signum: int) -> KeyboardInterrupt:
    """The KeyboardInterrupt a stop by signal SIGNUM ends in ('stopped by SIGTERM')."""
    return KeyboardInterrupt(f"{_REASON_PREFIX}{signal.Signals(signum).name}")


def stop_exit_code(reason: BaseException | str | None) -> int:
    """The shell's exit code for a stop: 128 + the signal's number (SIGTERM 143, SIGHUP 129), 130 for Ctrl-C
    or any other interruption. REASON is the KeyboardInterrupt (or its text) that stop_interrupt made."""
    text = str(reason or "")
    if text.startswith(_REASON_PREFIX):
        name = text[len(_REASON_PREFIX):].split()[0] if text[len(_REASON_PREFIX):] else ""
        if name in signal.Signals.__members__:
            return 128 + int(signal.Signals[name])
    return 128 + int(signal.SIGINT)


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

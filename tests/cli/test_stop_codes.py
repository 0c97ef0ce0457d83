"""A command stopped by a signal exits with the shell's code for it (128 + the signal's number) and one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tongyi_trace.stops import stop_exit_code, stop_interrupt


def test_exit_codes_follow_the_signal() -> None:
    assert stop_exit_code(stop_interrupt(signal.SIGTERM)) == 143
    assert stop_exit_code("stopped by SIGHUP") == 129
    assert stop_exit_code(KeyboardInterrupt()) == 130 and stop_exit_code(None) == 130
    assert stop_exit_code("stopped while reading the engine's final figures") == 130


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_long_command_stopped_by_a_signal(sig: signal.Signals, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tongyi_trace.cli", "synth", "--profile", "to-c", "--seed", "1",
                             "--scale", "20", "-o", str(tmp_path / "big.jsonl"), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3.0)  # past start-up: inside the command (a 20x trace takes far longer)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err  # SIGTERM 143 (was 130), Ctrl-C 130
    assert err.count("\n") == 1 and "interrupted" in err and "Traceback" not in err

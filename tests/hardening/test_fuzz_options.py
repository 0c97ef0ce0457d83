"""Fuzz the numeric options of `kvtrace analyze` and of the replay schedule: any value either works or is
exit 2 / UsageError with one line naming the option."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.lanes import examples
from tongyi_trace.cli import app
from tongyi_trace.errors import UsageError
from tongyi_trace.replay.prompts import PromptSynth
from tongyi_trace.replay.schedule import ScheduleOptions, build_schedule

runner = CliRunner()
NUMBERS = st.floats(allow_nan=True, allow_infinity=True) | st.integers(min_value=-(2**40), max_value=2**40)
FLOAT_OPTIONS = ("--window-s", "--memory-limit-gib", "--gpu-util", "--gpu-mem-gib", "--reserve-gib", "--params-b")
INT_OPTIONS = ("--top-n", "--threads", "--tp", "--layers", "--kv-heads", "--head-dim", "--dtype-bytes")


@pytest.fixture(scope="module")
def run_dir(tiny_bailian_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tongyi_trace.trace.ingest import ingest_trace

    out = tmp_path_factory.mktemp("fuzzopts") / "run"
    ingest_trace(tiny_bailian_path, out)
    return out


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(FLOAT_OPTIONS + INT_OPTIONS), value=NUMBERS)
@example(option="--gpu-mem-gib", value=4e298).via("a huge GPU memory overflowed polars' integers")
@example(option="--layers", value=2**40).via("a huge model shape")
def test_analyze_numeric_options(run_dir: Path, option: str, value: float) -> None:
    if option in INT_OPTIONS:
        value = int(value) if value == value and abs(value) < 2**62 else 0
    r = runner.invoke(app, ["analyze", str(run_dir), option, str(value), "--only", "hit_ratio", "-q"])
    assert "Traceback" not in r.output, r.output
    assert r.exit_code in (0, 2), r.output
    if r.exit_code == 2 and "Invalid value" not in r.output:  # not Typer's own parse error ('nan' for an int)
        assert r.output.count("\n") == 1 and r.output.startswith("error: "), r.output
        assert "--" in r.output or "model option" in r.output, r.output  # names what to change


@settings(max_examples=examples(60), deadline=None)
@given(speedup=NUMBERS, start=NUMBERS, duration=st.none() | NUMBERS, sample=st.none() | NUMBERS,
       min_token_id=st.integers(min_value=-10, max_value=40000))
def test_schedule_and_prompt_options(speedup: float, start: float, duration: float | None,
                                     sample: float | None, min_token_id: int) -> None:
    requests = pl.DataFrame({"req_idx": [0, 1], "session_id": [0, 0], "parent_chat_id": [-1, 0],
                             "chat_id": [0, 1], "arrival_s": [0.0, 1.0], "input_tokens": [32, 48],
                             "output_tokens": [2, 3], "category": ["text-1", "text-2"]})
    try:
        sched = build_schedule(requests, ScheduleOptions(speedup=speedup, start_s=start, duration_s=duration,
                                                         sample_sessions=sample), None)
        PromptSynth(0, 32000, 16, min_token_id)
    except UsageError as e:
        assert str(e).count("\n") == 0 and str(e).startswith("--")
        return
    assert all(r.scheduled_s >= 0 and r.scheduled_s == r.scheduled_s for r in sched.requests)

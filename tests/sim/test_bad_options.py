"""`kvtrace simulate` options out of range: exit 2 and one line naming the value, nothing written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app

REQS = [[1, 2], [3], [1, 2], [4], [3]]


@pytest.mark.parametrize(("extra", "needle"), [
    (["-c", "inf%"], "capacity 'inf%' is not a finite size"),
    (["-c", "1e400x"], "capacity '1e400x' is not a finite size"),
    (["-c", "1e30"], "is not a number of blocks"),
    (["-c", "1000000000000000000"], "more than 1e+15"),
    (["-c", "nan%"], "capacity 'nan%' is not a finite size"),
    (["--set", "s3fifo.small_ratio=-1", "-p", "s3fifo"], "small_ratio must be in (0, 1)"),
    (["--set", "s3fifo.small_ratio=nan", "-p", "s3fifo"], "parameter small_ratio must be float"),
    (["--set", "s3fifo.ghost_ratio=inf", "-p", "s3fifo"], "parameter ghost_ratio must be float"),
    (["--set", "gdsf.attn_scale_tokens=0", "-p", "gdsf"], "attn_scale_tokens must be > 0"),
    (["--jobs", "-1"], "--jobs -1"),
    (["--engine-block-size", "0"], "--engine-block-size must be positive"),
    (["--engine-block-size", "100000000"], "--engine-block-size 100000000: no request fills one block of that "
                                           "many tokens (the longest prompt has "),  # issue 42: "no block references"
    (["--set", "wa.use_life=false", "-p", "lru"], "--set wa.*: policy wa is not simulated (-p lru); add it to -p "
                                                  "or drop the --set"),  # issue 42: silently ignored
    (["--arrival-scale", "nan"], "--arrival-scale must be a finite number > 0"),
    (["--arrival-scale", "0"], "--arrival-scale must be a finite number > 0 (the cost model's arrival_scale), "
                               "got 0.0"),
    (["--prefill-s-per-token", "-1"], "--prefill-s-per-token must be a finite number >= 0"),
    (["--prefill-overhead-s", "-1"], "--prefill-overhead-s must be a finite number >= 0"),
    (["--confidence", "1"], "--confidence 1.0: give a confidence level strictly between 0 and 1 (e.g. 0.95)"),
    (["--confidence", "nan"], "--confidence nan: give a confidence level strictly between 0 and 1"),
    (["-p", ""], "--policy is empty"),
    (["-p", " , "], "--policy is empty"),
    (["-p", "lru,oracle-deadd"], "unknown policy 'oracle-deadd'; choose from lru, fifo, lfu, s3fifo, gdsf, wa, "
                                 "oracle, fitted, wa-no-life, wa-conditional, wa-no-offset, wa-no-guard, oracle-dead "
                                 "(or all)"),
])
def test_simulate_bad_values_are_one_line(make_run: Callable[..., Path], extra: list[str], needle: str) -> None:
    run = make_run(REQS)
    res = CliRunner().invoke(app, ["simulate", str(run), *extra, "-j", "1"] if "--jobs" not in extra
                             else ["simulate", str(run), *extra])
    assert res.exit_code == 2, res.output
    assert needle in res.output and res.output.strip().count("\n") == 0 and "Traceback" not in res.output
    assert not (run / "sim" / "results.parquet").exists()

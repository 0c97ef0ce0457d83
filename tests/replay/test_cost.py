"""The TTFT cost model: one estimator (replay/cost.py), one edge rule, one artifact the simulator reads."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.optimize import nnls

from tongyi_trace.errors import InputError
from tongyi_trace.replay.cost import MIN_POINTS, fit_ttft_cost
from tongyi_trace.replay.records import RECORD_SCHEMA
from tongyi_trace.replay.runner import ReplayOptions, run_replay
from tongyi_trace.replay.schedule import ScheduleOptions
from tongyi_trace.replay.standin import StandInState
from tongyi_trace.run import open_run
from tongyi_trace.schemas import COST_SCHEMA
from tongyi_trace.sim.cost_model import calibrate_from_replay, preset_cost

BASE = preset_cost("qwen2-7b")


def _ok(points: list[tuple[int, int | None, float | None]]) -> pl.DataFrame:
    """Completed records from (prompt_tokens, cached_tokens, ttft_ms)."""
    rows = [{"prompt_tokens": p, "cached_tokens": c, "ttft_ms": t, "status": "ok"} for p, c, t in points]
    return pl.DataFrame(rows, schema={k: RECORD_SCHEMA[k] for k in ("prompt_tokens", "cached_tokens", "ttft_ms",
                                                                    "status")})


def test_exact_line_is_recovered_with_its_figures() -> None:
    # ttft = 50 ms + 1 ms per uncached token; uncached 100, 100, 300, 18 (the last one is excluded: no
    # cached_tokens, so its uncached tokens are unknown; it is counted, not dropped silently)
    fit = fit_ttft_cost(_ok([(100, 0, 150.0), (200, 100, 150.0), (300, 0, 350.0), (50, 32, 68.0),
                             (400, None, 999.0)]))
    assert fit is not None
    assert (fit["a_s"], fit["b_s_per_token"], fit["r2"]) == (pytest.approx(0.05), pytest.approx(0.001),
                                                             pytest.approx(1.0))
    assert fit["schema"] == COST_SCHEMA == "kvtrace.cost/2"
    assert (fit["num_points"], fit["num_without_cached_tokens"], fit["constrained"]) == (4, 1, False)
    assert (fit["uncached_tokens_min"], fit["uncached_tokens_max"]) == (18, 300)


def test_unconstrained_fit_is_ordinary_least_squares() -> None:
    rng = np.random.default_rng(7)
    x = rng.integers(0, 4000, 200)
    y_ms = 20.0 + 0.3 * x + rng.normal(0, 15, 200)
    fit = fit_ttft_cost(_ok([(int(u), 0, float(t)) for u, t in zip(x, y_ms, strict=True)]))
    b, a = np.polyfit(x.astype(float), y_ms / 1e3, 1)
    assert fit is not None and not fit["constrained"]
    assert (fit["a_s"], fit["b_s_per_token"]) == (pytest.approx(a, rel=1e-9), pytest.approx(b, rel=1e-9))


def test_a_falling_ttft_gives_a_flat_cost_not_a_negative_slope() -> None:
    # OLS slope is negative; the non-negative fit is the constant mean (b = 0), flagged
    fit = fit_ttft_cost(_ok([(100, 0, 300.0), (200, 0, 200.0), (300, 0, 100.0), (400, 0, 120.0)]))
    assert fit is not None and fit["constrained"]
    assert (fit["a_s"], fit["b_s_per_token"]) == (pytest.approx(0.18), 0.0)


def test_a_negative_intercept_is_held_at_zero() -> None:
    # y = -0.1 + 0.002 x (s): OLS intercept < 0; with a = 0 the best slope is sum(xy) / sum(x^2)
    x = np.array([100.0, 200.0, 300.0, 400.0])
    y = -0.1 + 0.002 * x
    fit = fit_ttft_cost(_ok([(int(u), 0, float(t) * 1e3) for u, t in zip(x, y, strict=True)]))
    assert fit is not None and fit["constrained"]
    assert fit["a_s"] == 0.0
    assert fit["b_s_per_token"] == pytest.approx(float((x * y).sum() / (x * x).sum()))
    (a_ref, b_ref), _ = nnls(np.stack([np.ones_like(x), x], axis=1), y)
    assert (fit["a_s"], fit["b_s_per_token"]) == (pytest.approx(a_ref), pytest.approx(b_ref))


@pytest.mark.parametrize("points", [
    [(100, 0, 150.0), (300, 0, 350.0)],  # fewer than MIN_POINTS
    [(100, 0, 150.0), (300, 0, 350.0), (400, None, 450.0), (500, None, 550.0)],  # nulls do not count
    [(100, 0, 150.0), (300, 0, None), (200, 0, 250.0)],  # a missing TTFT does not count
    [(100, 0, 150.0), (200, 100, 160.0), (150, 50, 170.0)],  # one uncached-token value only
])
def test_edge_rule_no_cost_model(points: list[tuple[int, int | None, float | None]]) -> None:
    assert MIN_POINTS == 3
    assert fit_ttft_cost(_ok(points)) is None


def test_three_distinct_points_are_enough() -> None:
    fit = fit_ttft_cost(_ok([(100, 0, 150.0), (300, 0, 350.0), (200, 0, 250.0)]))
    assert fit is not None and fit["num_points"] == 3


def test_replay_exports_the_fit_and_the_simulator_reads_only_that(
        fresh_tiny_run: Path, standin: Callable[..., tuple[str, StandInState]]) -> None:
    url, _ = standin(block_size=32)
    res = run_replay(fresh_tiny_run, url, ReplayOptions(name="a", max_in_flight=1,
                                                         schedule=ScheduleOptions(speedup=1000.0)))
    own = json.loads((res.out_dir / "cost_model.json").read_text())
    latest = json.loads((fresh_tiny_run / "replay" / "cost_model.json").read_text())
    run_id = open_run(fresh_tiny_run).provenance()["run_id"]
    assert own["schema"] == latest["schema"] == COST_SCHEMA
    assert own["run_id"] == latest["run_id"] == run_id and latest["replay"] == "a"
    assert own["num_points"] == 6 and res.summary["cost_model"]["a_s"] == own["a_s"]
    # the run folder, the replay folder and the file itself name the same artifact
    for where in (fresh_tiny_run, res.out_dir, res.out_dir / "cost_model.json"):
        m = calibrate_from_replay(where, BASE)
        assert (m.overhead_s, m.s_per_token) == (own["a_s"], own["b_s_per_token"])
        assert m.s_per_loaded_token == BASE.s_per_loaded_token and m.name == "qwen2-7b+replay"
    # the records are not read: without them the artifact suffices, without the artifact nothing is fitted
    (res.out_dir / "records.jsonl").unlink()
    assert calibrate_from_replay(fresh_tiny_run, BASE).overhead_s == own["a_s"]
    shutil.copy(res.out_dir / "summary.json", res.out_dir / "records.jsonl")
    (res.out_dir / "cost_model.json").unlink()
    (fresh_tiny_run / "replay" / "cost_model.json").unlink()
    with pytest.raises(InputError, match="no cost model here"):
        calibrate_from_replay(fresh_tiny_run, BASE)


def test_the_simulator_refuses_a_stale_or_foreign_artifact(tmp_path: Path) -> None:
    path = tmp_path / "cost_model.json"
    path.write_text(json.dumps({"schema": "kvtrace.cost/1", "a_s": 0.2, "b_s_per_token": 0.0003}))
    with pytest.raises(InputError, match=r"expected 'kvtrace\.cost/2'"):
        calibrate_from_replay(path, BASE)
    path.write_text(json.dumps({"schema": COST_SCHEMA, "a_s": -0.2, "b_s_per_token": 0.0003}))
    with pytest.raises(InputError, match="must be finite numbers >= 0"):
        calibrate_from_replay(path, BASE)
    path.write_text(json.dumps({"schema": COST_SCHEMA, "a_s": 0.2}))
    with pytest.raises(InputError, match="b_s_per_token unreadable"):
        calibrate_from_replay(path, BASE)
    path.write_text(json.dumps({"schema": COST_SCHEMA, "a_s": 0.2, "b_s_per_token": 0.0003}))
    m = calibrate_from_replay(path, BASE)
    assert (m.overhead_s, m.s_per_token) == (0.2, 0.0003)


def test_replies_caching_more_than_the_prompt_are_left_out_and_counted() -> None:
    """Issue 42 #12: a reply whose cached_tokens exceed its prompt (uncached -900) never enters the fit: the
    line of the other four is recovered exactly and the reply is counted."""
    fit = fit_ttft_cost(_ok([(100, 0, 150.0), (200, 100, 150.0), (300, 0, 350.0), (50, 32, 68.0),
                             (100, 1000, 5.0)]))
    assert fit is not None
    assert (fit["a_s"], fit["b_s_per_token"], fit["r2"]) == (pytest.approx(0.05), pytest.approx(0.001),
                                                             pytest.approx(1.0))
    assert (fit["num_points"], fit["num_cached_over_prompt"], fit["uncached_tokens_min"]) == (4, 1, 18)
    over = _ok([(100, 1000, 5.0), (100, 2000, 5.0), (100, 0, 150.0), (200, 0, 250.0)])
    assert fit_ttft_cost(over) is None  # two usable points are no fit

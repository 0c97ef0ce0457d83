"""`fit_policy`: accuracy on a generator with known parameters, fallback, life_s, artifacts, policy file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.fit.events import load_accesses, parse_window, window_samples
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.policy.file import POLICY_SCHEMA, load_policy
from tongyi_trace.run import open_run

KNOWN = {  # the generator's parameters (tests/fit/conftest.py KNOWN_SPEC): p, lambda
    "text-1": (0.5, 1 / 60), "text-2": (0.7, 1 / 120), "text-3+": (0.8, 1 / 200),
    "file-1": (0.6, 1 / 600), "file-2": (0.4, 1 / 300), "file-3+": (0.5, 1 / 100),
}


def check_recovery(rows: list[dict]) -> None:
    checked = 0
    for r in rows:
        if r["category"] == "default" or r["train_num_samples"] < 2000:
            continue
        p, rate = KNOWN[r["category"]]
        assert abs(r["reuse_prob"] - p) <= 0.05, r
        assert abs(r["rate_per_s"] / rate - 1) <= 0.10, r
        assert r["mean_reuse_s"] == pytest.approx(1 / r["rate_per_s"])
        assert not r["fallback"]
        checked += 1
    assert checked == len(KNOWN)  # every category is well sampled: nothing was skipped


def test_recovers_known_parameters_over_the_whole_trace(known_run: Path, tmp_path: Path,
                                                        private_run: Callable[[Path], Path]) -> None:
    out = fit_policy(private_run(known_run), tmp_path / "policy.json", capacities=None)  # parameters only
    check_recovery(out.rows)
    assert out.train.to_json()["start_s"] == 0.0 and out.train.include_end
    assert out.train.start_s == out.train.origin_s > 0  # the first request's arrival


def test_recovers_known_parameters_in_a_window_ending_mid_trace(known_run: Path, tmp_path: Path,
                                                                private_run: Callable[[Path], Path]) -> None:
    out = fit_policy(private_run(known_run), tmp_path / "policy.json", train="0:4800", capacities=None)
    check_recovery(out.rows)
    file1 = next(r for r in out.rows if r["category"] == "file-1")
    assert file1["train_num_samples"] >= 2000
    # censoring matters there: ignoring it (p = share of accesses reused in the window, 1/lambda = mean
    # of the observed reuse times) misses both tolerances
    acc = load_accesses(open_run(known_run).tables())
    s = window_samples(acc, parse_window("0:4800", acc.trace_start_s, acc.trace_end_s, "--train"))["file-1"]
    naive_rate = s.num_observed / float(np.sum(s.time_s[s.observed] * s.count[s.observed]))
    assert naive_rate / KNOWN["file-1"][1] - 1 > 0.10
    assert KNOWN["file-1"][0] - s.num_observed / s.num_samples > 0.05


def test_test_window_reports_both_fits(known_run: Path, tmp_path: Path,
                                       private_run: Callable[[Path], Path]) -> None:
    run = private_run(known_run)
    out = fit_policy(run, tmp_path / "p.json", train="0:3600", test="3600:", capacities=None)
    rows = {r["category"]: r for r in out.rows}
    assert list(rows)[-1] == "default"
    for name in KNOWN:
        r = rows[name]
        assert r["test_num_samples"] > 1000
        assert abs(r["test_reuse_prob"] - KNOWN[name][0]) < 0.1
        # the same process in both halves: the train fit predicts the test data almost as well as its own
        assert r["test_ks_policy"] < 0.06 and r["test_ks_own"] < 0.06
    table = json.loads((run / "fit" / "train_test.json").read_text())
    assert table["schema"] == "kvtrace.fit-table/1"
    assert table["test"]["start_s"] == 3600.0 and table["rows"] == json.loads(json.dumps(out.rows))
    cdf = pl.read_parquet(run / "fit" / "cdf.parquet")
    assert cdf.columns == ["category", "window", "d_s", "empirical_cdf", "fitted_cdf", "policy_cdf"]
    assert set(cdf["window"]) == {"train", "test"}
    assert set(cdf["category"]) == {*KNOWN, "default"}
    one = cdf.filter((pl.col("category") == "text-1") & (pl.col("window") == "train")).drop_nulls()
    # the CDF curves: monotone, and the KM curve stays within the KS distance of the fit
    assert (one["empirical_cdf"].diff().drop_nulls() >= 0).all()
    assert (one["empirical_cdf"] - one["fitted_cdf"]).abs().max() <= rows["text-1"]["train_ks"] + 1e-12


def test_policy_file_round_trip_and_copy(known_run: Path, tmp_path: Path,
                                         private_run: Callable[[Path], Path]) -> None:
    known_run = private_run(known_run)  # the fit writes its artifacts into the run
    out = fit_policy(known_run, tmp_path / "sub" / "policy.json", min_samples=10)
    pol = load_policy(tmp_path / "sub" / "policy.json")
    assert pol == out.policy
    assert load_policy(known_run / "fit" / "policy.json") == pol
    doc = json.loads((tmp_path / "sub" / "policy.json").read_text())
    assert doc["schema"] == POLICY_SCHEMA
    assert doc["trace"] == {"source": "tests/fit generator", "sha256": "0" * 64, "format": "bailian",
                            "block_size": 16, "run_id": open_run(known_run).provenance().get("run_id")}
    assert doc["turn_buckets"] == [1, 2, 3]
    assert set(doc["categories"]) == set(KNOWN)
    assert set(doc["categories"]["text-1"]) == {"reuse_prob", "rate_per_s", "mean_reuse_s", "life_s",
                                                "num_samples", "ks", "fallback", "km_cdf"}
    # the Kaplan-Meier table: a CDF on the shared grid, below the category's reuse probability + noise
    km = doc["categories"]["text-1"]["km_cdf"]
    assert len(km) == len(doc["km_grid_s"]) and km == sorted(km) and km[0] >= 0.0 and km[-1] <= 1.0
    # the workload summary is its own artifact now, not part of the policy file
    assert "workload" not in doc
    work = json.loads((known_run / "fit" / "workload.json").read_text())
    assert work["schema"] == "kvtrace.workload/2"  # trace.synth_like.workload_summary
    assert work["num_requests"] == open_run(known_run).provenance()["num_requests"]
    # the default capacity-aware choice (1L): one entry, never worse than LRU on the train window
    assert [c["capacity"] for c in doc["choices"]] == ["1L"]
    assert doc["choices"][0]["train"]["gain_vs_lru"] >= 0
    assert doc["default"]["num_samples"] == sum(c["num_samples"] for c in doc["categories"].values())


# ---- small hand-made runs -------------------------------------------------------------------------

def conversation(start_s: float, gaps_s: list[float], type_: str | None, first_id: int,
                 ) -> list[tuple[float, str | None, int | None, list[int]]]:
    """One conversation: a turn per gap boundary, each holding the previous turn's blocks plus one."""
    out, t = [], start_s
    for k in range(len(gaps_s) + 1):
        out.append((t, type_, (k + 1) if type_ else None, list(range(first_id, first_id + k + 1))))
        if k < len(gaps_s):
            t += gaps_s[k]
    return out


def test_fallback_to_type_then_to_all(make_run: Callable[..., Path], tmp_path: Path) -> None:
    reqs = []
    for i in range(40):  # text: 40 two-turn conversations (text-1: 40 samples, text-2: 80)
        reqs += conversation(i * 10.0, [5.0], "text", 1000 * i)
    reqs += conversation(5.0, [], "file", 10**6)  # file-1: a single sample
    out = fit_policy(make_run(reqs), tmp_path / "p.json", min_samples=100)
    rows = {r["category"]: r for r in out.rows}
    assert rows["text-1"]["pool"] == "type:text" and rows["text-2"]["pool"] == "type:text"
    assert rows["file-1"]["pool"] == "all"  # its type's pool (1 sample) is too small too
    cats = out.policy.categories
    assert all(c.fallback for c in cats.values())
    assert cats["text-1"].rate_per_s == cats["text-2"].rate_per_s  # the same pooled fit
    assert (cats["file-1"].reuse_prob, cats["file-1"].rate_per_s) == (out.policy.default.reuse_prob,
                                                                        out.policy.default.rate_per_s)
    assert cats["file-1"].num_samples == 1  # its own count, not the pool's
    assert rows["text-1"]["own_reuse_prob"] != cats["text-1"].reuse_prob
    # pooled text fit: 40 reuses after 5 s (text-1) and 80 accesses censored after 10 s or more (text-2):
    # with censoring times that long against 5 s, p is close to 40/120 and 1/lambda to 5 s
    assert cats["text-1"].reuse_prob == pytest.approx(40 / 120, abs=0.01)
    assert cats["text-1"].rate_per_s == pytest.approx(1 / 5, rel=0.01)
    # default: not a fallback as long as the whole trace has enough samples
    assert out.policy.default.fallback is False


def test_traces_without_types_have_one_category(make_run: Callable[..., Path], tmp_path: Path) -> None:
    reqs = conversation(0.0, [2.0, 4.0], None, 0) + conversation(1.0, [8.0], None, 100)
    out = fit_policy(make_run(reqs), tmp_path / "p.json", min_samples=1)
    assert list(out.policy.categories) == ["all"]
    assert out.policy.categories["all"].reuse_prob == out.policy.default.reuse_prob


def test_life_s_quantile_and_override(make_run: Callable[..., Path], tmp_path: Path) -> None:
    # text conversations with gaps: lifespans of their blocks are known exactly
    reqs = conversation(0.0, [10.0, 10.0], "text", 0) + conversation(100.0, [40.0], "text", 100)
    run = make_run(reqs)
    # text-1 blocks: first conv block 0 lives 0..20 -> 20; second conv block 100 lives 100..140 -> 40
    # text-2 block 1 (first seen at 10) lives 10..20 -> 10
    out = fit_policy(run, tmp_path / "p.json", min_samples=1, life_quantile=1.0)
    assert out.policy.categories["text-1"].life_s == 40.0
    assert out.policy.categories["text-2"].life_s == 10.0
    assert out.policy.default.life_s == 40.0
    out = fit_policy(run, tmp_path / "p.json", min_samples=1, life_quantile=0.0)
    assert out.policy.categories["text-1"].life_s == 20.0
    out = fit_policy(run, tmp_path / "p.json", min_samples=1, life_s=123.0)
    assert {c.life_s for c in out.policy.categories.values()} == {123.0}
    assert out.policy.default.life_s == 123.0
    # text-3+ (turn 3 of the first conversation) reuses nothing: p = 0, mean reuse written as null
    cat = out.policy.categories["text-3+"]
    assert cat.reuse_prob == 0.0 and math.isinf(cat.mean_reuse_s)
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["categories"]["text-3+"]["mean_reuse_s"] is None
    assert math.isinf(load_policy(tmp_path / "p.json").categories["text-3+"].mean_reuse_s)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_samples": 0}, "--min-samples"),
    ({"life_quantile": 1.5}, "--life-quantile"),
    ({"life_s": -1.0}, "--life-s"),
    ({"train": "500:600"}, r"--train 500:600: starts past the trace.s end \(the trace spans 0:2 s from its first "
                            r"request\); give --train a window inside the trace"),
    ({"train": "0:x"}, "must be numbers"),
    ({"test": "9:3"}, "--test"),
    ({"test": "500:600"}, "--test 500:600: starts past the trace.s end"),
    ({"test": "1:1.5"}, r"--test 1:1.5: no block access in this window \(the trace spans 0:2 s"),
])
def test_bad_options(make_run: Callable[..., Path], tmp_path: Path, kwargs: dict, message: str) -> None:
    run = make_run(conversation(0.0, [2.0], "text", 0))
    with pytest.raises(UsageError, match=message):
        fit_policy(run, tmp_path / "p.json", **kwargs)


def test_holdout_of_an_instant_trace_says_what_to_do(make_run: Callable[..., Path], tmp_path: Path) -> None:
    """Every request at t = 0: the train window is 0:0, the part before its held-out end is empty."""
    run = make_run(conversation(0.0, [0.0], "text", 0))
    with pytest.raises(UsageError, match=r"^--holdout 0.5: the part of the train window before its held-out end "
                       r"\(0:0 s\): no block access .*; use --holdout 0 or a longer train window$"):
        fit_policy(run, tmp_path / "p.json", capacities="1")
    assert fit_policy(run, tmp_path / "p.json", capacities="1", holdout=0.0).policy.choices


def test_empty_holdout_end_says_what_to_do(make_run: Callable[..., Path], tmp_path: Path) -> None:
    """A held-out end without a request would choose on nothing (every hit ratio 0, LRU by the tie): refused."""
    run = make_run([(0.0, "text", 1, [1]), (1.0, "text", 2, [1, 2]), (10.0, "text", 2, [1, 2, 3])])
    with pytest.raises(UsageError, match=r"^--holdout 0.5: the held-out end of the train window \(4:8 s, where "
                       r"the setting per capacity is chosen\): no block access .*; use --holdout 0 or a longer "
                       r"train window$"):
        fit_policy(run, tmp_path / "p.json", train="0:8", capacities="1", min_samples=1)
    assert fit_policy(run, tmp_path / "p.json", train="0:8", capacities="1", min_samples=1, holdout=0.0).policy.choices


def test_a_train_window_far_past_the_end_says_so_not_holdout(make_run: Callable[..., Path], tmp_path: Path) -> None:
    """`--train 0:99999` on a 10 s trace: its held-out end (49999.5:99999) is past the trace's end. The error
    names --train and the trace's length (it blamed --holdout); a window ending a little past the end, whose
    held-out end still holds requests, fits as the whole trace."""
    run = make_run([(0.0, "text", 1, [1]), (4.0, "text", 2, [1, 2]), (10.0, "text", 2, [1, 2, 3])])
    with pytest.raises(UsageError, match=r"^--train 0:99999: ends past the trace's end \(the trace spans 0:10 s from "
                       r"its first request\), so the held-out end of the train window \(49999.5:99999 s\) holds no "
                       r"request; give --train a window within 0:10 \(START: runs to the end\)$"):
        fit_policy(run, tmp_path / "p.json", train="0:99999", capacities="1", min_samples=1)
    assert fit_policy(run, tmp_path / "p.json", train="0:12", capacities="1", min_samples=1).policy.choices


@pytest.mark.parametrize("train", [None, "0:60"])
def test_a_trace_whose_clock_starts_late_fits_as_if_it_started_at_0(
        make_run: Callable[..., Path], tmp_path: Path, train: str | None) -> None:
    """Windows count from the first request: a slice of a longer trace, or one stamped with epoch seconds,
    takes the same options and gives the same policy as the trace moved to start at 0 (the --holdout split
    included: measured from 0 instead, its first part was empty and fit refused the trace)."""
    reqs = [(5.0 * i, "text" if i % 3 else "file", 1 + i % 3, list(range(1, 2 + i % 4))) for i in range(24)]
    late = [(1_700_000_000.0 + t, *rest) for t, *rest in reqs]
    a = fit_policy(make_run(reqs, "early"), tmp_path / "a.json", train=train, capacities="2,4", min_samples=1)
    b = fit_policy(make_run(late, "late"), tmp_path / "b.json", train=train, capacities="2,4", min_samples=1)
    assert b.policy.categories == a.policy.categories and b.policy.default == a.policy.default
    assert b.policy.choices == a.policy.choices and b.policy.window == a.policy.window
    assert b.rows == a.rows and str(b.train) == str(a.train) == ("0:115" if train is None else "0:60")
    assert b.train.start_s == 1_700_000_000.0


def test_not_a_run_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a kvtrace run folder"):
        fit_policy(tmp_path, tmp_path / "p.json")


# ---- policy file errors (load_policy) ------------------------------------------------------------

@pytest.fixture
def policy_doc(make_run: Callable[..., Path], tmp_path: Path) -> dict:
    fit_policy(make_run(conversation(0.0, [2.0, 3.0], "text", 0)), tmp_path / "good.json", min_samples=1)
    return json.loads((tmp_path / "good.json").read_text())


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(schema="kvtrace.policy/9"), r"field 'schema' is 'kvtrace.policy/9'"),
    (lambda d: d.pop("default"), r"field 'default' is missing"),
    (lambda d: d["categories"]["text-1"].pop("rate_per_s"), r"field 'categories.text-1.rate_per_s' is missing"),
    (lambda d: d["categories"]["text-2"].update(rate_per_s=-0.5),
     r"'categories.text-2.rate_per_s' is -0.5, outside \[0, inf\]"),
    (lambda d: d["default"].update(reuse_prob=1.5), r"'default.reuse_prob' is 1.5, outside \[0, 1\]"),
    (lambda d: d["default"].update(num_samples=float("inf")), r"'default.num_samples' must be a finite number"),
    (lambda d: d.update(turn_buckets=[3, 1, 2]), r"field 'turn_buckets' must be a non-empty increasing list"),
    (lambda d: d.update(turn_buckets=[-1, 2]), r"field 'turn_buckets' must be a non-empty increasing list"),
    (lambda d: d["default"]["km_cdf"].reverse(), r"field 'default.km_cdf' must not decrease"),
    (lambda d: d["default"].update(km_cdf=[0.5]), r"field 'default.km_cdf' must be a list of 64 numbers"),
    (lambda d: d.update(km_grid_s=[1.0] * 64), r"field 'km_grid_s' differs"),
    (lambda d: d.update(choices=[{"policy": "lfu", "capacity_blocks": 10}]), r"'choices\[0\].policy' is 'lfu'"),
    (lambda d: d.update(choices=[{"policy": "wa", "capacity_blocks": 0.5}]),
     r"'choices\[0\].capacity_blocks' is 0.5, outside"),
    (lambda d: d["default"].update(life_s="10"), r"'default.life_s' must be a finite number"),
])
def test_policy_file_errors(policy_doc: dict, tmp_path: Path, edit: Callable[[dict], object],
                            message: str) -> None:
    edit(policy_doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(policy_doc))
    with pytest.raises(InputError, match=message) as e:
        load_policy(bad)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_policy_file_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "kvtrace.policy/1",\n  oops}')
    with pytest.raises(InputError, match=r"bad.json:2: invalid JSON"):
        load_policy(bad)


def test_mooncake_conversation_counts_match_the_readme(mooncake_conversation_run: Path, tmp_path: Path,
                                                       private_run: Callable[[Path], Path]) -> None:
    # ../shared/traces/README.md: 288,500 block references, 182,790 distinct blocks (prefix-chained ids).
    # Over the whole trace every reference is a sample, and exactly the references whose block comes
    # back later are observed reuses: 288,500 - 182,790 (ideal hit ratio 0.3664 x 288,500).
    out = fit_policy(private_run(mooncake_conversation_run), tmp_path / "p.json", capacities=None)
    default = next(r for r in out.rows if r["category"] == "default")
    # Mooncake has no types; its turns and sessions are inferred at ingest (trace/sessions.py), so the
    # categories are the turn buckets, follow-ups split by their gap to the previous turn
    cats = list(out.policy.categories)
    assert sorted({c.split("|")[0] for c in cats}) == ["unknown-1", "unknown-2", "unknown-3+"]
    assert "unknown-1" in cats and any(c.startswith("unknown-2|g") for c in cats)
    assert default["train_num_samples"] == 288_500
    assert default["train_num_observed"] == 288_500 - 182_790
    assert 0.0 < out.policy.default.reuse_prob < 1.0 and out.policy.default.life_s > 0


def test_version_1_policy_files_still_load(tmp_path: Path) -> None:
    from tongyi_trace.policy.file import POLICY_SCHEMA_V1
    from tongyi_trace.policy.wa_priority import exp_cdf, km_grid_s

    p = tmp_path / "v1.json"
    p.write_text(json.dumps({"schema": POLICY_SCHEMA_V1, "turn_buckets": [1, 2, 3],
                             "categories": {"text-1": {"reuse_prob": 0.5, "rate_per_s": 0.1, "life_s": 30.0}},
                             "default": {"reuse_prob": 0.2, "rate_per_s": 0.01, "life_s": 60.0},
                             "workload": {"schema": "kvtrace.workload/1"}}))
    pol = load_policy(p)
    assert pol.schema == POLICY_SCHEMA_V1 and pol.choices == [] and pol.choice_for(1000) is None
    # no Kaplan-Meier table in version 1: the km model reads the exponential model's CDF
    assert pol.categories["text-1"].km_cdf_table() == [exp_cdf(0.5, 0.1, t) for t in km_grid_s()]
    assert pol.categories["text-1"].mean_reuse_s == 10.0

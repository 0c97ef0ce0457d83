"""Context classes in the categories (`kvtrace fit --context`): golden gap and pace classes on a hand-made
table, causality, the policy file round trip and the fallback a mismatched tag takes, and the path through
fit, the simulator's stream and the replay's tags on a real synthetic run."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.fit.events import Window
from tongyi_trace.fit.policy_fit import fit_context, fit_policy
from tongyi_trace.policy.file import CategoryParams, PolicyParams, RequestContext, load_policy, save_policy
from tongyi_trace.replay.schedule import tagged_requests
from tongyi_trace.run import open_run
from tongyi_trace.sim.stream import load_stream
from tongyi_trace.trace.categories import context_categories, follow_up_gaps_s
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file


def _requests(rows: list[tuple[int, int, str | None, float, str]]) -> pl.DataFrame:
    """(chat_id, parent_chat_id, user_id, arrival_s, category) -> a requests table in arrival order."""
    return pl.DataFrame({
        "req_idx": list(range(len(rows))),
        "chat_id": [r[0] for r in rows],
        "parent_chat_id": [r[1] for r in rows],
        "user_id": pl.Series([r[2] for r in rows], dtype=pl.Utf8),
        "arrival_s": [r[3] for r in rows],
        "category": [r[4] for r in rows],
    })


# user a: follow-ups after 10 s and 20 s (fast), then a new chat; user b: follow-ups after 300 s and 500 s
# (slow); user c: one follow-up only; a request without a user id
TABLE = _requests([
    (0, -1, "a", 0.0, "text-1"),
    (1, 0, "a", 10.0, "text-2"),
    (2, 1, "a", 30.0, "text-3+"),
    (3, -1, "b", 40.0, "text-1"),
    (4, -1, "a", 50.0, "text-1"),
    (5, 3, "b", 340.0, "text-2"),
    (6, -1, "c", 400.0, "file-1"),
    (7, 6, "c", 410.0, "file-2"),
    (8, 5, "b", 840.0, "text-3+"),
    (9, -1, None, 900.0, "text-1"),
    (10, 8, "b", 850.0, "text-3+"),
    (11, 7, "c", 420.0, "file-3+"),
])


def pace(split_s: float, min_gaps: int) -> RequestContext:
    return RequestContext(pace_split_s=split_s, pace_min_gaps=min_gaps)


def test_pace_classes_golden() -> None:
    got = context_categories(TABLE, pace(60.0, 2)).to_list()
    assert got == [
        "text-1|p?",  # a: no gap yet
        "text-2|p?",  # a: its own gap (10 s) does not count, only EARLIER requests' gaps
        "text-3+|p?",  # a: one earlier gap (10 s) < min_gaps
        "text-1|p?",  # b: none
        "text-1|pf",  # a: gaps 10 s and 20 s, geometric mean of (1 + gap) ~ 15.6 s < 60 s
        "text-2|p?",  # b: none earlier
        "file-1|p?",
        "file-2|p?",
        "text-3+|p?",  # b: one earlier gap (300 s)
        "text-1|p?",  # no user id
        "text-3+|ps",  # b: 300 s and 500 s earlier
        "file-3+|p?",  # c: one earlier gap
    ]
    # with one gap enough, c's third request knows c's 10 s gap and b's third knows 300 s
    one = context_categories(TABLE, pace(60.0, 1)).to_list()
    assert one[11] == "file-3+|pf" and one[8] == "text-3+|ps" and one[2] == "text-3+|pf"


def test_gap_classes_golden() -> None:
    both = RequestContext(gap_splits_s=(30.0, 120.0, 600.0), pace_split_s=60.0, pace_min_gaps=1)
    got = context_categories(TABLE, both).to_list()
    assert got == [
        "text-1|p?",  # a first turn has no gap class
        "text-2|g0|p?",  # 10 s < 30 s
        "text-3+|g0|pf",  # 20 s
        "text-1|p?",
        "text-1|pf",
        "text-2|g2|p?",  # 300 s in [120, 600)
        "file-1|p?",
        "file-2|g0|p?",
        "text-3+|g2|ps",  # 500 s
        "text-1|p?",
        "text-3+|g0|ps",  # 10 s
        "file-3+|g0|pf",
    ]
    only_gap = context_categories(TABLE, RequestContext(gap_splits_s=(15.0,))).to_list()
    assert only_gap[:3] == ["text-1", "text-2|g0", "text-3+|g1"]


def test_context_classes_use_only_earlier_requests() -> None:
    """Changing a later request's gap never changes an earlier request's class."""
    ctx = RequestContext(gap_splits_s=(30.0,), pace_split_s=60.0, pace_min_gaps=1)
    base = context_categories(TABLE, ctx).to_list()
    later = TABLE.with_columns(arrival_s=pl.when(pl.col("chat_id") == 10).then(5000.0).otherwise(pl.col("arrival_s")))
    changed = context_categories(later, ctx).to_list()
    assert changed[:10] == base[:10] and changed[11] == base[11] and changed[10] != base[10]


def test_follow_up_gaps() -> None:
    assert sorted(follow_up_gaps_s(TABLE).tolist()) == [10.0, 10.0, 10.0, 10.0, 20.0, 300.0, 500.0]


def _params(ctx: RequestContext | None) -> PolicyParams:
    cat = CategoryParams(0.5, 0.1, 10.0, 30.0)
    return PolicyParams(categories={"text-2|pf": cat, "text-2|p?": CategoryParams(0.2, 0.1, 10.0, 30.0),
                                    "file-1": CategoryParams(0.9, 1.0, 1.0, 5.0)},
                        default=CategoryParams(0.1, 0.01, 100.0, 60.0), context=ctx)


def test_policy_file_round_trip_and_fallbacks(tmp_path: Path) -> None:
    p = tmp_path / "policy.json"
    ctx = RequestContext((30.0, 120.0), 42.5, 3)
    save_policy(_params(ctx), p)
    back = load_policy(p)
    assert back.context == ctx
    assert back.for_category("text-2|pf").reuse_prob == 0.5
    assert back.for_category("file-1|g1|ps").reuse_prob == 0.9  # classes the file lacks -> the base category
    assert back.for_category("image-1|pf").reuse_prob == 0.1  # neither -> default
    assert back.for_category("text-2").reuse_prob == 0.1
    save_policy(_params(None), p)
    assert load_policy(p).context is None
    doc = json.loads(p.read_text())
    del doc["context"]  # files written before the field existed
    p.write_text(json.dumps(doc))
    assert load_policy(p).context is None
    for bad, field in (({"pace_split_s": 10.0, "pace_min_gaps": 0}, "context.pace_min_gaps"),
                       ({"gap_splits_s": [120, 30]}, "context.gap_splits_s"),
                       ({"gap_splits_s": [-1]}, "context.gap_splits_s"),
                       ({"pace_split_s": "x"}, "context.pace_split_s"), ([1], "'context'")):
        doc["context"] = bad
        p.write_text(json.dumps(doc))
        with pytest.raises(InputError, match=field):
            load_policy(p)


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pace")
    trace = d / "toc.jsonl"
    synth_to_file("to-c", 3, trace, num_requests=3000)
    ingest_trace(trace, d / "run")
    return d / "run"


def test_fit_with_context_tags_every_consumer_alike(synth_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    fit_policy(synth_run, out, capacities=None, context="gap,pace", min_samples=50)
    pol = load_policy(out)
    assert pol.context is not None and pol.context.pace_split_s is not None and pol.context.pace_split_s > 0
    assert pol.context.gap_splits_s == (30.0, 120.0, 600.0)
    for part in ("|g0", "|g3", "|pf", "|ps", "|p?"):
        assert any(part in name for name in pol.categories), part
    run = open_run(synth_run)
    expected = context_categories(run.requests(), pol.context).to_list()
    stream = load_stream(run.tables(), context=pol.context)
    assert [stream.categories[c] for c in stream.req_cat] == expected
    assert tagged_requests(run, out)["category"].to_list() == expected
    auto = tmp_path / "auto.json"
    fit_policy(synth_run, auto, capacities=None, min_samples=50)
    assert load_policy(auto).context == pol.context  # auto on a trace with users and follow-ups: both
    off = tmp_path / "off.json"
    fit_policy(synth_run, off, capacities=None, context="none", min_samples=50)
    assert load_policy(off).context is None
    assert all("|" not in n for n in load_policy(off).categories)
    assert tagged_requests(run, off)["category"].to_list() == run.requests()["category"].to_list()


def test_context_needs_follow_ups(tmp_path: Path, tiny_bailian_path: Path) -> None:
    run = tmp_path / "run"
    ingest_trace(tiny_bailian_path, run)
    fit_policy(run, tmp_path / "p.json", capacities=None)  # auto: none on a trace this small
    assert load_policy(tmp_path / "p.json").context is None
    fit_policy(run, tmp_path / "p.json", capacities=None, context="gap")  # asked for: fitted on what there is
    assert load_policy(tmp_path / "p.json").context == RequestContext(gap_splits_s=(30.0, 120.0, 600.0))
    flat = TABLE.with_columns(parent_chat_id=pl.lit(-1))
    with pytest.raises(UsageError, match=r"--context gap: the train window has no follow-up turn"):
        fit_context(flat, Window(0.0, 1e9, True), "gap")
    with pytest.raises(UsageError, match=r"--context pace: the trace has no user ids"):
        fit_context(TABLE.with_columns(user_id=pl.lit(None, pl.Utf8)), Window(0.0, 1e9, True), "pace")
    assert fit_context(flat, Window(0.0, 1e9, True), "auto") is None
    for bad in ("maybe", "auto,gap", "gap,,nothing"):
        with pytest.raises(UsageError, match=r"--context '"):
            fit_policy(run, tmp_path / "p.json", capacities=None, context=bad)


def test_holdout_chooses_on_the_train_windows_end(synth_run: Path, tmp_path: Path) -> None:
    """--holdout H: candidates are simulated on the last H of the train window (with parameters fitted on
    the rest) and the choice never loses to LRU there; --holdout 0 chooses on the whole window."""
    reqs = open_run(synth_run).requests()
    for holdout in (0.5, 0.0):
        out = tmp_path / f"h{holdout}.json"
        fit_policy(synth_run, out, capacities="0.5L", holdout=holdout, min_samples=50)
        rows = pl.read_parquet(synth_run / "fit" / "tuning.parquet").filter(pl.col("window") == "train")
        end_s = load_policy(out).window["end_s"]  # the train window: the whole trace
        held = reqs.filter(pl.col("arrival_s") >= (1.0 - holdout) * end_s) if holdout else reqs
        assert set(rows["num_refs"].to_list()) == {int(held["num_blocks"].sum())}
        choice = load_policy(out).choices[0]
        assert choice.train["gain_vs_lru"] >= 0 and choice.train["num_refs"] == int(held["num_blocks"].sum())
    with pytest.raises(UsageError, match=r"--holdout 0.95: must be within \[0, 0.9\]"):
        fit_policy(synth_run, tmp_path / "x.json", capacities="0.5L", holdout=0.95)

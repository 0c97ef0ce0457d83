"""The user's pace class in the categories (`kvtrace fit --user-pace`): golden classes on a hand-made table,
causality, the policy file round trip and the fallbacks a mismatched tag takes, and the path through fit,
the simulator's stream and the replay's tags on a real synthetic run."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.fit.params import CategoryParams, PolicyParams, UserPace, load_policy, save_policy
from tongyi_trace.fit.policy_fit import fit_policy
from tongyi_trace.replay.schedule import tagged_requests
from tongyi_trace.run import open_run
from tongyi_trace.sim.stream import load_stream
from tongyi_trace.trace.categories import pace_split_s, user_pace_categories
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


def test_pace_classes_golden() -> None:
    got = user_pace_categories(TABLE, split_s=60.0, min_gaps=2).to_list()
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
    one = user_pace_categories(TABLE, split_s=60.0, min_gaps=1).to_list()
    assert one[11] == "file-3+|pf" and one[8] == "text-3+|ps" and one[2] == "text-3+|pf"


def test_pace_classes_use_only_earlier_requests() -> None:
    """Changing a later request's gap never changes an earlier request's class."""
    base = user_pace_categories(TABLE, 60.0, 1).to_list()
    later = TABLE.with_columns(arrival_s=pl.when(pl.col("chat_id") == 10).then(5000.0).otherwise(pl.col("arrival_s")))
    changed = user_pace_categories(later, 60.0, 1).to_list()
    assert changed[:10] == base[:10] and changed[11] == base[11]


def test_pace_split_is_the_median_follow_up_gap() -> None:
    # gaps: 10, 20, 300, 10, 500, 10, 10 -> median 10
    assert pace_split_s(TABLE) == pytest.approx(10.0)


def _params(pace: UserPace | None) -> PolicyParams:
    cat = CategoryParams(0.5, 0.1, 10.0, 30.0)
    return PolicyParams(categories={"text-2|pf": cat, "text-2|p?": CategoryParams(0.2, 0.1, 10.0, 30.0),
                                    "file-1": CategoryParams(0.9, 1.0, 1.0, 5.0)},
                        default=CategoryParams(0.1, 0.01, 100.0, 60.0), user_pace=pace)


def test_policy_file_round_trip_and_fallbacks(tmp_path: Path) -> None:
    p = tmp_path / "policy.json"
    save_policy(_params(UserPace(42.5, 3)), p)
    back = load_policy(p)
    assert back.user_pace == UserPace(42.5, 3)
    assert back.for_category("text-2|pf").reuse_prob == 0.5
    assert back.for_category("text-2").reuse_prob == 0.2  # untagged request -> its unknown-pace class
    assert back.for_category("file-1|ps").reuse_prob == 0.9  # a tag the file lacks -> the base category
    assert back.for_category("image-1|pf").reuse_prob == 0.1  # neither -> default
    save_policy(_params(None), p)
    assert load_policy(p).user_pace is None
    doc = json.loads(p.read_text())
    del doc["user_pace"]  # files written before the field existed
    p.write_text(json.dumps(doc))
    assert load_policy(p).user_pace is None
    doc["user_pace"] = {"split_s": 10.0, "min_gaps": 0}
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"user_pace.min_gaps"):
        load_policy(p)


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pace")
    trace = d / "toc.jsonl"
    synth_to_file("to-c", 3, trace, num_requests=3000)
    ingest_trace(trace, d / "run")
    return d / "run"


def test_fit_with_user_pace_tags_every_consumer_alike(synth_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    fit_policy(synth_run, out, capacities=None, user_pace="on", min_samples=50)
    pol = load_policy(out)
    assert pol.user_pace is not None and pol.user_pace.split_s > 0
    assert any(name.endswith("|pf") for name in pol.categories) and any(n.endswith("|ps") for n in pol.categories)
    run = open_run(synth_run)
    expected = user_pace_categories(run.requests(), pol.user_pace.split_s, pol.user_pace.min_gaps).to_list()
    stream = load_stream(run, user_pace=pol.user_pace)
    assert [stream.categories[c] for c in stream.req_cat] == expected
    assert tagged_requests(run, out)["category"].to_list() == expected
    off = tmp_path / "off.json"
    fit_policy(synth_run, off, capacities=None, user_pace="off", min_samples=50)
    assert load_policy(off).user_pace is None
    assert all("|" not in n for n in load_policy(off).categories)
    assert tagged_requests(run, off)["category"].to_list() == run.requests()["category"].to_list()


def test_user_pace_on_needs_user_ids(tmp_path: Path, tiny_bailian_path: Path) -> None:
    run = tmp_path / "run"
    ingest_trace(tiny_bailian_path, run)
    with pytest.raises(UsageError, match=r"--user-pace on: the train window has"):
        fit_policy(run, tmp_path / "p.json", capacities=None, user_pace="on")
    fit_policy(run, tmp_path / "p.json", capacities=None)  # auto: off on a trace this small
    assert load_policy(tmp_path / "p.json").user_pace is None
    with pytest.raises(UsageError, match=r"--user-pace 'maybe'"):
        fit_policy(run, tmp_path / "p.json", capacities=None, user_pace="maybe")

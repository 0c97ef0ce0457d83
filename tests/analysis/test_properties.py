"""Property tests: on random small traces the analyses agree with a brute-force reference and with
each other (hits + misses = references, content >= prefix hits, spatial full window = ideal, ...)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.analysis import run_analyses
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace

WINDOWS = [(0, 1), (0, 5), (0, 7), (0, 10), (1, 10), (3, 5), (5, 10)]  # (offset, offset + stride), tenths
request = st.tuples(
    st.lists(st.integers(0, 4), min_size=1, max_size=6),  # hash ids from a small alphabet: much sharing
    # gap to the previous request, s (exact binary fractions; sometimes past 10 min)
    st.one_of(st.integers(0, 200).map(lambda q: q / 4), st.integers(2401, 2800).map(lambda q: q / 4)),
    st.sampled_from(["text", "file"]),
)


def _brute_force(reqs: list[tuple[list[int], float, str]]) -> dict[str, Any]:
    """Ideal prefix/content hits, reuse gaps, windowed (spatial) hits and the live-set peak, by hand."""
    seen_prefix: set[tuple[int, ...]] = set()
    seen_ids: set[int] = set()
    cached: dict[tuple[int, int], set[tuple[int, ...]]] = {w: set() for w in WINDOWS}
    window_hits = dict.fromkeys(WINDOWS, 0)
    last_seen: dict[tuple[int, ...], float] = {}
    hits = content = 0
    gaps: list[float] = []
    t = 0.0
    times = []
    for ids, gap, _ in reqs:
        t += gap
        times.append(t)
        prefixes = [tuple(ids[: p + 1]) for p in range(len(ids))]
        hits += sum(p in seen_prefix for p in prefixes)
        content += sum(i in seen_ids for i in ids)
        for p in prefixes:
            if p in last_seen:
                gaps.append(t - last_seen[p])
            last_seen[p] = t
        for (lo, hi), cache in cached.items():  # only blocks at relative positions [lo, hi) tenths are cached
            for p in prefixes:  # prefix matching: the first miss ends the request's hits
                if p not in cache:
                    break
                window_hits[lo, hi] += 1
            cache.update(p for i, p in enumerate(prefixes) if lo * len(ids) <= 10 * i < hi * len(ids))
        seen_prefix.update(prefixes)
        seen_ids.update(ids)
    # live set: a block is live from its first request to its last one (exclusive)
    first: dict[tuple[int, ...], int] = {}
    last: dict[tuple[int, ...], int] = {}
    for r, (ids, _, _) in enumerate(reqs):
        for p in range(len(ids)):
            first.setdefault(tuple(ids[: p + 1]), r)
            last[tuple(ids[: p + 1])] = r
    peak = max(sum(first[b] <= r < last[b] for b in first) for r in range(len(reqs)))
    return {"hits": hits, "content": content, "gaps": gaps, "window_hits": window_hits, "peak": peak,
            "refs": sum(len(ids) for ids, _, _ in reqs)}


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=st.lists(request, min_size=1, max_size=10))
def test_analyses_match_brute_force(tmp_path: Path, reqs: list[tuple[list[int], float, str]]) -> None:
    t = 0.0
    lines = []
    for i, (ids, gap, typ) in enumerate(reqs):
        t += gap
        lines.append(json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": t,
                                 "input_length": 16 * len(ids), "output_length": 1, "type": typ, "turn": 1,
                                 "hash_ids": ids}))
    trace = tmp_path / f"p{abs(hash(tuple(lines)))}.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    run_dir = trace.with_suffix(".run")
    ingest_trace(trace, run_dir)
    rep = run_analyses(RunDir(run_dir), write=False)
    ref = _brute_force(reqs)
    hr = rep.results["hit_ratio"].headline
    assert hr["num_block_refs"] == ref["refs"]
    assert hr["num_hit_blocks"] == ref["hits"]
    assert hr["content_hit_ratio"] == pytest.approx(ref["content"] / ref["refs"])
    assert hr["content_hit_ratio"] >= hr["hit_ratio"]
    assert 0.0 <= hr["token_hit_ratio"] <= 1.0
    rt = rep.results["reuse_time"].headline
    assert rt["num_reuses"] == ref["hits"] == rep.results["skew"].headline["num_reuses"]
    assert rt["sum_reuse_time_s"] == pytest.approx(sum(ref["gaps"]))
    assert rt["sum_reuse_time_after_600s_s"] == pytest.approx(sum(g for g in ref["gaps"] if g > 600.0))
    if ref["gaps"]:
        within = sum(g <= 10.0 for g in ref["gaps"]) / len(ref["gaps"])
        assert rt["share_within_10s"] == pytest.approx(within)
        assert rt["mean_reuse_time_s"] == pytest.approx(sum(ref["gaps"]) / len(ref["gaps"]))
    sp = rep.results["spatial"]
    assert sp.headline["full_window_hit_ratio"] == pytest.approx(hr["hit_ratio"])
    cells = {(o, s): n for o, s, n in sp.tables["heatmap"].filter(sp.tables["heatmap"]["type"].is_null())
             .select("offset_pct", "stride_pct", "num_hit_blocks").iter_rows()}
    for (lo, hi), n in ref["window_hits"].items():
        assert cells[10 * lo, 10 * (hi - lo)] == n, (lo, hi)
    head = [cells[0, s] for s in range(10, 101, 10)]
    assert head == sorted(head)  # a longer head window caches a superset
    assert rep.results["live_set"].headline["peak_live_blocks"] == ref["peak"]
    life = rep.results["lifespan"].headline
    # a block waits through each of its reuse times: they sum to its lifespan (last - first access)
    assert life["num_blocks"] * life["mean_lifespan_s"] == pytest.approx(rt["sum_reuse_time_s"])
    assert life["num_blocks"] == len({tuple(ids[: p + 1]) for ids, _, _ in reqs for p in range(len(ids))})
    assert 0.0 <= life["p50_s"] <= life["p90_s"] <= life["p99_s"]

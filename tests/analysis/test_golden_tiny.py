"""Golden figures of every analysis on tests/fixtures/tiny_bailian.jsonl, each derived by hand.

The fixture (see tests/fixtures/README.md), with prefix-chained blocks named by letter:
  r0 t=0    text-1   u1  ids 1 2 3        -> A B C          (40 tokens: 16 16 8), output 10
  r1 t=1    text-1   u2  ids 1 2          -> A B            hits A B
  r2 t=5    text-2   u1  ids 1 2 4 5      -> A B D E        hits A B        (parent r0)
  r3 t=6.5  search-1 u3  ids 2 1 6        -> F G H          no hit (same ids, other order)
  r4 t=20   text-3+  u1  ids 1 2 4 5 7    -> A B D E I      hits A B D E    (parent r2)
  r5 t=30   text-3+  u1  ids 1 2 4 5 7 8  -> A B D E I J    hits A B D E I  (parent r4)
23 references, 10 distinct blocks, 13 hits.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.analysis.conftest import RunFactory
from tongyi_trace.analysis import AnalysisReport, run_analyses
from tongyi_trace.models import PRESETS


def h(rep: AnalysisReport, name: str) -> dict:
    res = rep.results[name]
    assert res.status == "ok", res.reason
    return res.headline


def test_hit_ratio(tiny_report: AnalysisReport) -> None:
    hr = h(tiny_report, "hit_ratio")
    assert hr["num_block_refs"] == 23 and hr["num_hit_blocks"] == 13
    assert hr["hit_ratio"] == pytest.approx(13 / 23)
    # tokens: 40+32+64+48+80+96 = 360; hit tokens r1 32 + r2 32 + r4 64 + r5 80 = 208
    assert hr["token_hit_ratio"] == pytest.approx(208 / 360)
    # content ids anywhere earlier: r1 2, r2 2, r3 2 (ids 2 and 1), r4 4, r5 5
    assert hr["content_hit_ratio"] == pytest.approx(15 / 23)
    assert hr["by_category"] == pytest.approx({"text-1": 2 / 5, "text-2": 2 / 4, "search-1": 0.0,
                                               "text-3+": 9 / 11})
    assert hr["by_type"] == pytest.approx({"text": 13 / 20, "search": 0.0})


def test_request_mix(tiny_report: AnalysisReport) -> None:
    m = h(tiny_report, "request_mix")
    assert m["type_share"] == pytest.approx({"text": 5 / 6, "search": 1 / 6})
    assert m["multi_turn_share"] == pytest.approx(3 / 6)  # r2, r4, r5 have turn >= 2
    assert m["multi_turn_share_by_type"] == pytest.approx({"text": 3 / 5, "search": 0.0})
    # turns over requests 1,1,2,1,3,4: nearest rank P50 = 3rd of 6 = 1, P90 = 6th = 4
    assert (m["turn_p50"], m["turn_p90"], m["turn_max"]) == (1, 4, 4)
    # conversations {r0 r2 r4 r5} (deepest turn 4), {r1} (1), {r3} (1): P50 = 2nd of 1,1,4 = 1, P90 = 3rd = 4
    assert (m["num_conversations"], m["conversation_turns_p50"], m["conversation_turns_p90"]) == (3, 1, 4)
    convs = tiny_report.results["request_mix"].tables["conversation_turns"]
    assert dict(convs.iter_rows()) == {1: 2, 4: 1}
    # requests per user: u1 4, u2 1, u3 1; the top 10% (0.3 user) send 4 each vs a mean of 2
    assert m["key_kind"] == "user" and m["num_keys"] == 3
    assert m["top10_turn_ratio"] == pytest.approx(2.0)
    turns = tiny_report.results["request_mix"].tables["turns"]
    assert dict(turns.iter_rows()) == {1: 3, 2: 1, 3: 1, 4: 1}


def test_turn_hits(tiny_report: AnalysisReport) -> None:
    t = h(tiny_report, "turn_hits")
    # single-turn requests r0 r1 r3 hit 2; follow-ups r2 r4 r5 hit 2 + 4 + 5 = 11
    assert t["single_turn_hit_share"] == pytest.approx(2 / 13)
    assert t["multi_turn_hit_share"] == pytest.approx(11 / 13)
    assert t["single_turn_hit_ratio"] == pytest.approx(2 / 8)
    assert t["multi_turn_hit_ratio"] == pytest.approx(11 / 15)


def test_user_heatmap(tiny_report: AnalysisReport) -> None:
    u = h(tiny_report, "user_heatmap")
    # r1 (u2) hits A B computed by r0 (u1): off-diagonal 2; u1's own follow-ups hit 2 + 4 + 5 = 11
    assert u["diagonal_share"] == pytest.approx(11 / 13)
    m = tiny_report.results["user_heatmap"].tables["matrix"]
    cells = {(p, c): n for p, c, n in m.select("producer", "consumer", "num_hits").iter_rows()}
    assert cells == {("u1", "u1"): 11, ("u1", "u2"): 2}


def test_skew(tiny_report: AnalysisReport) -> None:
    s = h(tiny_report, "skew")
    # reuses per block: A 4, B 4, D 2, E 2, I 1, C F G H J 0 -> 13 reuses over 10 blocks
    assert (s["num_distinct_blocks"], s["num_reused_blocks"], s["num_reuses"]) == (10, 5, 13)
    assert s["top10_block_reuse_share"] == pytest.approx(4 / 13)  # the top 1 block
    assert s["top10_reused_block_reuse_share"] == pytest.approx(0.5 * 4 / 13)  # half of block A
    # hits per user: u1 11, u2 2, u3 0; 90% of 13 = 11.7 needs u1 and u2
    assert s["key_share_for_90pct_hits"] == pytest.approx(2 / 3)
    curve = tiny_report.results["skew"].tables["blocks_curve"]
    assert curve["share_value"][0] == 0.0 and curve["share_value"][-1] == pytest.approx(1.0)
    assert curve.filter(pl.col("share_items") == 0.2)["share_value"].item() == pytest.approx(8 / 13)


def test_next_turn(tiny_report: AnalysisReport) -> None:
    n = h(tiny_report, "next_turn")
    # r0 -> r2 (5 s later), r2 -> r4 (15 s), r4 -> r5 (10 s): 3 of 6 requests have a next turn
    assert n["next_turn_prob"] == pytest.approx(0.5)
    assert n["next_turn_prob_in_window"] == pytest.approx(0.5)
    assert n["single_turn_next_prob"] == pytest.approx(1 / 3)  # r0 of r0 r1 r3
    assert n["multi_turn_next_prob"] == pytest.approx(2 / 3)  # r2 r4 of r2 r4 r5
    assert n["by_category"] == pytest.approx({"text-1": 0.5, "text-2": 1.0, "text-3+": 0.5, "search-1": 0.0})
    windows = tiny_report.results["next_turn"].tables["windows"]
    assert windows["window_idx"].unique().to_list() == [0]  # all within the first 600 s


def test_next_turn_windows_count_from_the_first_request(tiny_report: AnalysisReport, tiny_bailian_path: Path,
                                                        make_run: RunFactory) -> None:
    # the same trace on a clock 599.5 s later: still one window (measured from 0, it straddled 600 s)
    rows = [json.loads(line) for line in tiny_bailian_path.read_text().splitlines()]
    late = make_run([{**r, "timestamp": r["timestamp"] + 599.5} for r in rows], "late")
    got = run_analyses(late, only="next_turn").results["next_turn"].tables["windows"]
    assert got.equals(tiny_report.results["next_turn"].tables["windows"])


def test_reuse_time(tiny_report: AnalysisReport) -> None:
    r = h(tiny_report, "reuse_time")
    # next-access gaps: A and B 1, 4, 15, 10; D and E 15, 10; I 10 -> 13 reuses, 9 of them <= 10 s
    assert (r["num_accesses"], r["num_reuses"]) == (23, 13)
    assert r["share_within_10s"] == pytest.approx(9 / 13)
    assert r["share_within_600s"] == pytest.approx(1.0)
    # the same gaps summed: 2 x 30 + 2 x 25 + 10 = 120 block-seconds, the lifespans' sum (A, B, D, E, I)
    assert r["sum_reuse_time_s"] == pytest.approx(120.0)
    assert r["mean_reuse_time_s"] == pytest.approx(120.0 / 13)
    assert (r["sum_reuse_time_after_600s_s"], r["mean_reuse_time_after_600s_s"]) == (0.0, None)
    life = h(tiny_report, "lifespan")
    assert life["num_blocks"] * life["mean_lifespan_s"] == pytest.approx(r["sum_reuse_time_s"])
    cats = r["by_category"]
    assert cats["text-1"]["reuse_prob"] == pytest.approx(4 / 5)  # r0's C is never reused
    assert cats["text-2"]["share_within_10s"] == pytest.approx(0.0)  # r2's blocks come back after 15 s
    assert cats["text-3+"]["reuse_prob"] == pytest.approx(5 / 11)
    assert cats["search-1"]["share_within_10s"] is None  # no reuse at all: undefined, not 0
    cdf = tiny_report.results["reuse_time"].tables["cdf"].filter(pl.col("category") == "(all)")
    at_10 = cdf.filter(pl.col("upper_s") == 10.0)
    assert at_10["cum_num_reuses"].item() == 9
    assert at_10["prob_reused_within"].item() == pytest.approx(9 / 23)


def test_spatial(tiny_report: AnalysisReport) -> None:
    s = h(tiny_report, "spatial")
    assert s["full_window_hit_ratio"] == pytest.approx(13 / 23)
    # head half (pos < num_blocks / 2 cached): r1 A B, r2 A B (D uncached), r4 A B (D cached only by
    # r4 itself), r5 A B D (E never cached) -> 9
    assert s["head_50pct_hit_ratio"] == pytest.approx(9 / 23)
    assert s["tail_50pct_hit_ratio"] == 0.0  # the head block A is never cached, so nothing matches
    heat = tiny_report.results["spatial"].tables["heatmap"]
    overall = heat.filter(pl.col("type").is_null())
    assert overall.height == 55
    text = heat.filter(pl.col("type") == "text", pl.col("offset_pct") == 0, pl.col("stride_pct") == 100)
    assert text["hit_ratio"].item() == pytest.approx(13 / 20)


def test_lifespan(tiny_report: AnalysisReport) -> None:
    life = h(tiny_report, "lifespan")
    # lifespans: A B 30, D E 25, I 10, C F G H J 0 -> sorted 0 0 0 0 0 10 25 25 30 30
    assert life["mean_lifespan_s"] == pytest.approx(12.0)
    assert life["p50_s"] == pytest.approx(5.0)  # halfway between 0 and 10
    assert life["p90_s"] == pytest.approx(30.0)
    assert life["reused_p50_s"] == pytest.approx(25.0)
    # per category of the first access: text-3+ holds I (10) and J (0): P90 = 0.9 x 10
    assert life["by_category"]["text-3+"]["p90_s"] == pytest.approx(9.0)
    assert life["by_category"]["text-1"]["mean_lifespan_s"] == pytest.approx(20.0)


def test_kv_size(tiny_report: AnalysisReport) -> None:
    k = h(tiny_report, "kv_size")
    q = k["models"]["qwen2-7b"]
    assert q["mib_per_16_tokens"] == 0.875
    assert q["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2
    # input + output tokens: 50 37 72 51 84 98 -> nearest-rank P50 51, P99 98
    assert q["total_kv_p50_bytes"] == 51 * 57344
    assert q["total_kv_max_bytes"] == 98 * 57344
    hbm = PRESETS["qwen2-7b"].hbm_kv_bytes
    assert q["total_p99_x_hbm"] == pytest.approx(98 * 57344 / hbm)


def test_live_set(tiny_report: AnalysisReport) -> None:
    live = h(tiny_report, "live_set")
    # live after r0..r5: {A,B} {A,B} {A,B,D,E} same, +I -> 5, then all die at r5 -> 0
    assert live["peak_live_blocks"] == 5 and live["peak_time_s"] == 20.0
    assert live["mean_live_blocks"] == pytest.approx(17 / 6)
    m = PRESETS["llama3-70b"]
    assert live["models"]["llama3-70b"]["peak_bytes"] == 5 * m.kv_bytes_per_block(16)
    assert live["models"]["llama3-70b"]["peak_x_hbm"] == pytest.approx(5 * m.kv_bytes_per_block(16) / m.hbm_kv_bytes)
    ts = tiny_report.results["live_set"].tables["timeseries"]
    assert ts["num_live_blocks"].to_list() == [2, 2, 4, 4, 5, 0]  # one bucket per request here

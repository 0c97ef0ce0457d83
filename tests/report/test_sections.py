"""Which sections the report shows, from which artifacts, with which numbers (tiny fixture, checked by
hand in tests/fixtures/README.md), and that every figure is a valid Plotly figure."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import plotly.graph_objects as go
import pytest

from tongyi_trace.analysis import run_analyses
from tongyi_trace.errors import InputError
from tongyi_trace.report import render_report
from tongyi_trace.report.figures import figure_json
from tongyi_trace.report.render import build_sections
from tongyi_trace.run import RunDir, open_run
from tongyi_trace.vllm_plugin.stats import PluginStats

ANALYSES = ["hit_ratio", "request_mix", "turn_hits", "user_heatmap", "skew", "next_turn", "reuse_time",
            "spatial", "lifespan", "kv_size", "live_set"]


def _text(html: str) -> str:
    """The page's visible text, roughly: tags dropped, whitespace collapsed (scripts removed first)."""
    html = re.sub(r"<script\b.*?</script>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_every_step_gives_its_sections_in_order(evil_run: RunDir) -> None:
    keys = [s.key for s in build_sections(evil_run)]
    assert keys == ["recommendation", "provenance", *ANALYSES, "fit", "sim", "replay-0", "replay-1", "compare-0"]


def test_tiny_fixture_numbers_reach_the_page(evil_run: RunDir) -> None:
    text = _text(render_report(evil_run).read_text())
    # Ideal prefix hits 13 of 23 references (fixtures/README.md).
    assert "56.5% of block references (13 of 23)" in text
    assert "ideal prefix hit ratio (blocks) 0.5652 0.62 (A), 0.54 (B)" in text
    # Content-id hits (no prefix rule) 15 of 23 = 0.6522 (fixtures/README.md).
    assert "content-id hit ratio (no prefix rule) 0.6522" in text
    # Provenance: 6 requests, 23 references, 10 distinct blocks, 30 s.
    assert "requests 6 block references 23 distinct blocks 10 block size 16 tokens duration 30 s" in text
    # The simulator at unlimited capacity (all 10 distinct blocks): every policy reaches the ideal 13 / 23.
    assert "inf 10 " + " ".join(["0.5652"] * 7) in text
    # What to run at 1L = the oracle's peak live set, 5 blocks: every policy hits the train window's 4 of 12
    # (requests 1 and 2, nothing evicted before), so LRU stays, no candidate beating it; the test window from
    # cold: 5 of 11. Every gain over LRU carries its interval (a tie: exactly 0).
    assert "What to run per capacity" in text
    assert "1L 5 lru 0.3333 0.3333 +0.00 +- 0.00 +0.00 (lru) no candidate beats LRU (best: fifo +0.00 +- 0.00 " \
           "points) 0.4545 +0.00 +- 0.00" in text
    # The fit's train window and the replays' names.
    assert "train window (0-15 s)" in text
    assert "Live replay on vLLM: first" in text and "Engine comparison: first vs second" in text


def test_headline_table_has_a_row_per_headline_figure(evil_run: RunDir) -> None:
    sections = build_sections(evil_run)
    html = render_report(evil_run).read_text()
    table = html.split('<section id="headline">')[1].split("</section>")[0]
    # the first rows, then the rest behind "show all": every headline figure once, each table with its header
    assert table.count("<tr>") - table.count("<thead>") == sum(len(s.headline) for s in sections) > 20
    assert table.count("<thead>") == 2 and "show all" in table


def test_every_figure_is_a_valid_plotly_figure(evil_run: RunDir) -> None:
    figures = [f for s in build_sections(evil_run) for f in s.figures.values()]
    assert len(figures) > 20
    for fig in figures:
        spec = json.loads(figure_json(fig))
        go.Figure(spec)  # raises ValueError on any attribute plotly.js does not know
        assert spec["data"], "a figure without traces"


def test_page_is_self_contained_with_plotly_inlined_once(evil_run: RunDir) -> None:
    html = render_report(evil_run).read_text()
    assert html.count("plotly.js v") == 1
    # No markup loads anything (the browser test also refuses every request that is not the file).
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "", html, flags=re.S)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", markup)
    assert "<link" not in markup and "<script src" not in html


def test_a_run_with_only_the_ingest_shows_provenance_and_what_to_run(bare_run: RunDir) -> None:
    assert [s.key for s in build_sections(bare_run)] == ["provenance"]
    text = _text(render_report(bare_run).read_text())
    assert "Not in this report" in text and "kvtrace analyze RUN_DIR" in text
    assert "fields present none beyond timestamps, lengths and block ids" in text


def test_analyses_a_trace_cannot_support_say_why(bare_run: RunDir, tmp_path: Path) -> None:
    run = open_run(shutil.copytree(bare_run.path, tmp_path / "run"))
    run_analyses(run)
    sections = {s.key: s for s in build_sections(run)}
    assert sections["request_mix"].absent_reason == ("the trace has no request types or turns (e.g. a Mooncake "
                                                     "trace ingested with --no-infer-sessions)")
    assert sections["hit_ratio"].absent_reason is None
    assert "by_type" in sections["hit_ratio"].absent_parts
    text = _text(render_report(run).read_text())
    assert "Not shown: the trace has no turn numbers (e.g. a Mooncake trace ingested with --no-infer-sessions)" in text
    assert "Not shown (by type): the trace has no request types" in text


def test_a_broken_artifact_is_a_one_line_error_naming_it(evil_run: RunDir, tmp_path: Path) -> None:
    run = open_run(shutil.copytree(evil_run.path, tmp_path / "run"))
    (run.path / "analysis" / "hit_ratio.json").write_text("{not json")
    with pytest.raises(InputError, match=r"analysis/hit_ratio\.json: unreadable artifact .*re-run 'kvtrace analyze"):
        build_sections(run)
    (run.path / "analysis" / "hit_ratio.json").unlink()
    (run.path / "analysis" / "lifespan_cdf.parquet").unlink()
    with pytest.raises(InputError, match=r"lifespan_cdf\.parquet: table 'cdf' of analysis 'lifespan' is missing"):
        build_sections(run)


def test_plugin_counters_show_in_the_replay_section(evil_run: RunDir, tmp_path: Path) -> None:
    run = open_run(shutil.copytree(evil_run.path, tmp_path / "run"))
    stats = PluginStats("wa")
    for category, ns in [("text-1", 50_000), ("text-1", 70_000), ("<b>x</b>", 90_000)]:
        stats.record_eviction(category, ns, cached=True)
    (run.path / "replay" / "first" / "plugin_stats.json").write_text(json.dumps(stats.snapshot()))
    replay = next(s for s in build_sections(run) if s.key == "replay-0")
    assert replay.values["plugin"]["evictions"] == "3"
    assert replay.values["plugin"]["mean_us"] == "70"  # (50 + 70 + 90) / 3 microseconds
    assert replay.tables["plugin"].rows == [["text-1", "2"], ["<b>x</b>", "1"]]
    assert any(h.label == "plugin eviction decision mean / P99 (wa)" for h in replay.headline)
    html = render_report(run).read_text()
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html

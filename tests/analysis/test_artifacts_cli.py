"""Artifacts on disk, `kvtrace analyze` end to end, and the real Mooncake traces."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tongyi_trace.analysis import ANALYSES, AnalysisOptions, resolve_models, run_analyses
from tongyi_trace.cli import app
from tongyi_trace.errors import UsageError
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace

runner = CliRunner()


def test_every_analysis_writes_json_and_its_tables(tmp_path: Path, tiny_bailian_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path / "run")
    rep = run_analyses(RunDir(tmp_path / "run"))
    out = tmp_path / "run" / "analysis"
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["analyses"]) == list(ANALYSES)
    assert summary["trace"]["num_block_refs"] == 23
    assert [m["name"] for m in summary["models"]] == ["qwen2-7b", "llama2-13b", "llama3-70b"]
    for name, res in rep.results.items():
        doc = json.loads((out / f"{name}.json").read_text())
        assert doc["schema"] == "kvtrace.analysis/1" and doc["status"] == "ok"
        assert doc["headline"] == json.loads(json.dumps(res.headline))
        for key, file in doc["tables"].items():
            assert pl.read_parquet(out / file).equals(res.tables[key])
    assert not list(out.glob("duckdb-*")), "the DuckDB spill folder is removed"


def test_only_keeps_other_results_in_the_summary(tmp_path: Path, tiny_bailian_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path / "run")
    run_analyses(RunDir(tmp_path / "run"), only="skew")
    run_analyses(RunDir(tmp_path / "run"), only=["hit_ratio"])
    summary = json.loads((tmp_path / "run" / "analysis" / "summary.json").read_text())
    assert list(summary["analyses"]) == ["hit_ratio", "skew"]
    with pytest.raises(UsageError, match="unknown analysis nope"):
        run_analyses(RunDir(tmp_path / "run"), only="hit_ratio,nope")


def test_models_custom_and_overrides() -> None:
    (q,) = resolve_models(["qwen2-7b"], dtype_bytes=1)
    assert q.kv_bytes_per_token == 28 * 1024 and q.name == "qwen2-7b*"
    (c,) = resolve_models(["custom"], num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, params_b=8,
                          tp=2, gpu_mem_gib=40)
    assert c.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 and c.tp == 2
    with pytest.raises(UsageError, match="--model custom needs --layers"):
        resolve_models(["custom"], head_dim=128)
    with pytest.raises(UsageError, match="unknown model preset"):
        resolve_models(["gpt-5"])
    with pytest.raises(UsageError, match="exceed GPU memory"):
        resolve_models(["llama3-70b"], tp=1)


def test_cli_json_on_a_raw_trace(tmp_path: Path, tiny_bailian_path: Path) -> None:
    res = runner.invoke(app, ["analyze", str(tiny_bailian_path), "-o", str(tmp_path / "r"), "--json",
                              "--only", "hit_ratio,live_set", "--model", "llama3-70b", "--tp", "8"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["analyses"]["hit_ratio"]["headline"]["hit_ratio"] == pytest.approx(13 / 23)
    assert doc["models"][0]["tp"] == 8
    assert set(doc["analyses"]) == {"hit_ratio", "live_set"}


def test_cli_table_and_errors(tmp_path: Path, tiny_bailian_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path / "run")
    res = runner.invoke(app, ["analyze", str(tmp_path / "run"), "--quiet"])
    assert res.exit_code == 0 and res.stdout == ""
    res = runner.invoke(app, ["analyze", str(tmp_path / "run"), "--only", "turn_hits"])
    assert res.exit_code == 0 and "single_turn_hit_share" in res.stdout
    res = runner.invoke(app, ["analyze", str(tmp_path / "run"), "--only", "bogus"])
    assert res.exit_code == 2 and "unknown analysis bogus" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["analyze", str(tmp_path)])
    assert res.exit_code == 2 and "not a kvtrace run folder" in res.output


def test_mooncake_conversation_ideal_hit_ratio(mooncake_conversation_run: Path) -> None:
    rep = run_analyses(RunDir(mooncake_conversation_run), only="hit_ratio,skew,reuse_time",
                       options=AnalysisOptions(), write=False)
    hr = rep.results["hit_ratio"].headline
    assert (hr["num_requests"], hr["num_block_refs"]) == (12_031, 288_500)  # traces/README.md
    assert hr["hit_ratio"] == pytest.approx(0.3664, abs=0.0005)
    assert rep.results["skew"].headline["num_distinct_blocks"] == 182_790
    assert rep.results["reuse_time"].headline["num_reuses"] == hr["num_hit_blocks"]


def test_mooncake_synthetic_ideal_hit_ratio(mooncake_synthetic_path: Path, tmp_path: Path) -> None:
    ingest_trace(mooncake_synthetic_path, tmp_path / "syn")
    rep = run_analyses(RunDir(tmp_path / "syn"), only="hit_ratio", write=False)
    hr = rep.results["hit_ratio"].headline
    assert hr["num_block_refs"] == 121_877
    assert hr["hit_ratio"] == pytest.approx(0.6396, abs=0.0005)


def test_cli_report_flag_writes_the_html(tmp_path: Path, tiny_bailian_path: Path) -> None:
    res = runner.invoke(app, ["analyze", str(tiny_bailian_path), "-o", str(tmp_path / "r"), "--report", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["report"] == str(tmp_path / "r" / "report.html")
    assert (tmp_path / "r" / "report.html").stat().st_size > 0

"""`kvtrace compare` on two hand-written replay folders (no engine): figures, differences, notes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.replay.compare import compare_replays, resolve_replay
from tongyi_trace.vllm_plugin.stats import PluginStats, stats_delta


def _summary(name: str, plugin: dict | None) -> dict:
    """A replay summary without engine block figures (so no simulator prediction is attempted)."""
    doc = {"schema": "kvtrace.replay/1", "name": name, "status": "complete", "trace": {"source": "t.jsonl"}}
    if plugin is not None:
        doc["plugin"] = plugin
    return doc


def _record(i: int, prompt: int, cached: int | None, ttft_ms: float | None, status: str = "ok") -> dict:
    return {"req_idx": i, "session_id": i, "category": "text-1", "scheduled_s": float(i), "sent_s": float(i),
            "drift_ms": 0.0, "ttft_ms": ttft_ms, "e2e_ms": ttft_ms, "prompt_tokens": prompt,
            "engine_prompt_tokens": prompt, "cached_tokens": cached, "output_tokens": 1, "max_tokens": 1,
            "status": status, "http_status": 200, "error": None}


def _write(run: Path, name: str, summary: dict, records: list[dict] | None = None) -> Path:
    d = run / "replay" / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    if records is not None:
        (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


# A: 100 + 300 prompt tokens, 40 cached -> 10%; TTFT 100, 300 ms.
# B: 100 + 300 prompt tokens, 160 cached -> 40%; TTFT 50, 150 ms; a failed request is left out.
RECORDS_A = [_record(0, 100, 0, 100.0), _record(1, 300, 40, 300.0)]
RECORDS_B = [_record(0, 100, 32, 50.0), _record(1, 300, 128, 150.0), _record(2, 999, None, None, "error")]


def _plugin_doc() -> dict:
    s = PluginStats(mode="wa")
    for ns in (1000, 2000, 3000, 100_000):
        s.record_eviction("text-1", ns, cached=True)
    s.record_eviction("default", 1000, cached=True)
    doc = s.snapshot()
    doc["policy_path"] = "/nonexistent/policy.json"
    return doc


def test_compare_side_by_side(tmp_path: Path) -> None:
    a = _write(tmp_path, "lru", _summary("lru", None), RECORDS_A)
    b = _write(tmp_path, "wa", _summary("wa", _plugin_doc()), RECORDS_B)
    comp = compare_replays(a, b)
    assert comp.a.eviction == "lru (vLLM, no plugin)" and comp.b.eviction == "wa"
    assert comp.a.engine_hit_ratio == pytest.approx(0.10) and comp.b.engine_hit_ratio == pytest.approx(0.40)
    assert comp.diff["engine_hit_ratio"] == pytest.approx(0.30)
    assert comp.a.ttft_ms == pytest.approx({"mean": 200.0, "p50": 200.0, "p99": 298.0})
    assert comp.diff["ttft_p99_ms"] == pytest.approx(149.0 - 298.0)  # p99 of (50, 150): 50 + 0.99 x 100
    assert comp.a.num_requests == 2 and comp.b.num_requests == 2
    assert comp.b.plugin is not None and comp.b.plugin["evictions"] == 5
    assert comp.b.plugin["evictions_by_category"] == {"text-1": 4, "default": 1}
    assert comp.b.plugin["decision_mean_us"] == pytest.approx(107.0 / 5)
    assert comp.a.predicted_hit_ratio == {"lru": None, "wa": None, "fitted": None}  # no engine block figures
    assert any("simulator predictions unavailable" in n for n in comp.a.notes)
    assert any("cannot read the policy file" in n for n in comp.b.notes)
    written = json.loads((tmp_path / "replay" / "compare_lru_vs_wa.json").read_text())
    assert written["schema"] == "kvtrace.compare/1" and written["b"]["eviction"] == "wa"


def test_compare_cli_json_and_errors(tmp_path: Path) -> None:
    a = _write(tmp_path / "r1", "x", _summary("x", None), RECORDS_B)
    b = _write(tmp_path / "r2", "y", _summary("y", None), RECORDS_A)
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "r1"), str(b), "--json",
                                   "-o", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["diff"]["engine_hit_ratio"] == pytest.approx(-0.30)
    assert resolve_replay(tmp_path / "r1") == a
    with pytest.raises(InputError):
        resolve_replay(tmp_path / "nothing")
    _write(tmp_path / "r1", "z", _summary("z", None))
    with pytest.raises(UsageError, match="several replays"):
        resolve_replay(tmp_path / "r1")
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "nothing"), str(b)])
    assert res.exit_code == 2 and "no replay here" in res.output


def test_stats_delta_gives_the_window_figures() -> None:
    s = PluginStats(mode="wa")
    s.record_eviction("a", 1000, cached=True)
    before = s.snapshot()
    for _ in range(99):
        s.record_eviction("b", 2000, cached=True)
    s.record_eviction("b", 500_000, cached=True)
    d = stats_delta(before, s.snapshot())
    assert d["evictions"] == 100 and d["evictions_by_category"] == {"b": 100}
    assert d["decision_mean_us"] == pytest.approx((99 * 2000 + 500_000) / 100 / 1000)
    # P50 is the upper edge of the bucket holding 2 us (20 buckets a decade: within 12%)
    assert 2.0 <= d["decision_p50_us"] <= 2.0 * 10 ** (1 / 20)
    assert 2.0 <= d["decision_p99_us"] <= 2.0 * 10 ** (1 / 20)   # rank 99 of 100 is still 2 us
    other = dict(before, pid=-1)
    assert stats_delta(other, s.snapshot())["evictions"] == 101


def test_compare_refuses_a_folder_that_is_not_a_replay(tmp_path: Path) -> None:
    """Issue 42 #10: `compare A RUN2/sim` (a simulate sweep's summary.json) is refused in one line, exit 2,
    never compared as "lru (vLLM, no plugin)"."""
    a = _write(tmp_path / "r1", "x", _summary("x", None), RECORDS_A)
    sim = tmp_path / "r2" / "sim"
    sim.mkdir(parents=True)
    (sim / "summary.json").write_text(json.dumps({"schema": "kvtrace.sim/1", "policies": ["lru"]}))
    res = CliRunner().invoke(app, ["compare", str(a), str(sim)])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1
    assert f"{sim}: not a replay (its summary.json is 'kvtrace.sim/1', a replay's is 'kvtrace.replay/1')" \
        in " ".join(res.output.split())


def test_replays_outside_a_run_are_compared_with_a_note_naming_the_folder(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42: `compare` of replay folders given relative to the current folder, outside any run, named the
    folder '.'; now the comparison is made and the note names the real folders."""
    for name, recs in (("x", RECORDS_A), ("y", RECORDS_B)):
        d = tmp_path / "replay" / name
        d.mkdir(parents=True)
        summary = {**_summary(name, None), "engine": {"block_size": 16, "num_gpu_blocks": 100}}
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.chdir(tmp_path / "replay")
    comp = compare_replays(Path("x"), Path("y"))
    assert comp.diff["engine_hit_ratio"] == pytest.approx(0.30)
    assert f"{tmp_path / 'replay' / 'x'} is not inside a run folder (RUN/replay/NAME; {tmp_path} is none)" in \
        " ".join(comp.a.notes)
    assert comp.a.run_dir == str(tmp_path)

"""`kvtrace replay --sweep` against the REAL CPU vLLM engine (session fixture `cpu_engine`): two request rates of
four requests each; the table's throughput, latency and goodput figures are recomputed here from each point's
records.jsonl (vLLM's goodput: ok requests within every SLO, per second of the point's span)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from tests.replay.conftest import kvtrace_cli
from tongyi_trace.replay.records import read_records

pytestmark = pytest.mark.engine

SLO_TTFT_MS, SLO_TPOT_MS = 400.0, 100.0
TINY_OUTPUT_TOKENS = [json.loads(line)["output_length"]
                      for line in (Path(__file__).resolve().parent.parent / "fixtures" / "tiny_bailian.jsonl")
                      .read_text().splitlines() if line.strip()]


def test_rate_sweep_goodput_on_the_engine(cpu_engine: dict[str, Any], fresh_tiny_run: Path) -> None:
    out = kvtrace_cli("replay", str(fresh_tiny_run), "--server", cpu_engine["url"], "--name", "load", "--sweep",
                      "rate=2,4", "--slo", f"ttft_ms={SLO_TTFT_MS:g},tpot_ms={SLO_TPOT_MS:g}", "--max-requests", "4",
                      "--max-output", "4", "--reset-cache", "--json")
    doc = json.loads(out)
    assert doc["schema"] == "kvtrace.sweep/1" and doc["status"] == "complete"
    assert doc["slo"] == {"ttft_ms": SLO_TTFT_MS, "tpot_ms": SLO_TPOT_MS}
    # the tiny trace's first 4 requests arrive at 0, 1, 5, 6.5 s: rate R is speedup R x 6.5 / 3
    assert (doc["trace_requests"], doc["trace_span_s"]) == (4, 6.5)
    assert doc["rows"] == json.loads((fresh_tiny_run / "replay" / "load" / "sweep.json").read_text())["rows"]
    for row, rate in zip(doc["rows"], (2.0, 4.0), strict=True):
        assert row["rate"] == rate and row["speedup"] == pytest.approx(rate * 6.5 / 3)
        recs = read_records(fresh_tiny_run / "replay" / f"load-rate{rate:g}" / "records.jsonl")
        ok = recs.filter(pl.col("status") == "ok")
        assert ok.height == row["num_ok"] == 4 and row["num_error"] == 0
        # --max-output 4 caps the trace's lengths (10, 5, 8, 3 -> 4, 4, 4, 3; forced with min_tokens)
        assert sorted(ok["output_tokens"].to_list()) == sorted(min(n, 4) for n in TINY_OUTPUT_TOKENS[:4])
        span_s = float((ok["sent_s"] + ok["e2e_ms"] / 1e3).max()) - float(ok["sent_s"].min())
        good = ok.filter((pl.col("ttft_ms") <= SLO_TTFT_MS) & (pl.col("tpot_ms") <= SLO_TPOT_MS))
        assert row["duration_s"] == pytest.approx(span_s)
        assert row["num_good"] == good.height
        assert row["goodput_per_s"] == pytest.approx(good.height / span_s)
        assert row["requests_per_s"] == pytest.approx(4 / span_s)
        assert row["output_tokens_per_s"] == pytest.approx(int(ok["output_tokens"].sum()) / span_s)
        ttft = ok["ttft_ms"].to_numpy()
        assert row["ttft_ms"]["mean"] == pytest.approx(float(ttft.mean()))
        assert row["ttft_ms"]["median"] == pytest.approx(float(np.median(ttft)))
        assert row["tpot_ms"]["p99"] == pytest.approx(float(np.percentile(ok["tpot_ms"].to_numpy(), 99)))
        # the engine's own answer: each point's summary says where its vocabulary came from
        summary = json.loads((fresh_tiny_run / "replay" / f"load-rate{rate:g}" / "summary.json").read_text())
        assert summary["vocab"] == {"size": 32000, "source": "the local kvtrace engine's model"}

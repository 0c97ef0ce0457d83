"""`kvtrace capture` in front of the REAL CPU vLLM engine (session fixture `cpu_engine`, tests/conftest.py):
completions streamed and not, and the round trip of issue 38 item 2: `kvtrace replay` through the proxy gives
a captured trace whose chained-block partition is the replayed requests', with their send times.

Chat completions need an engine that serves a tokenizer (the `cpu_engine` runs with --skip-tokenizer-init, so
its /tokenize and /v1/chat/completions refuse): the capture of chat and text in front of the engine started
with `--tokenizer` is tests/capture/test_tokenize_engine.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import polars as pl
import pytest

from tests.capture.conftest import read_lines
from tests.replay.conftest import kvtrace_cli

pytestmark = pytest.mark.engine

TRACE_BLOCK = 16  # tokens per hash id of the synthetic trace and of the capture
ENGINE_BLOCK = 32  # the cpu_engine fixture's --block-size


def _body(model: str, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, **extra}


def test_completions_streamed_and_not_through_the_proxy(cpu_engine: dict[str, Any], start_capture: Any,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl.zst"
    cap = start_capture(cpu_engine["url"], out)
    model = httpx.get(cap.url + "/v1/models", timeout=30).json()["data"][0]["id"]  # any other path: forwarded
    head = list(range(30_000, 30_064))  # 64 tokens: two engine blocks, four trace blocks
    a, b = head + list(range(1_000, 1_024)), head + list(range(2_000, 2_040))
    with httpx.Client(base_url=cap.url, timeout=120) as client:
        r1 = client.post("/v1/completions", json=_body(model, a, 5))
        r2 = client.post("/v1/completions", json=_body(model, b, 3, stream=True,
                                                       stream_options={"include_usage": True}))
        chunks = [json.loads(x[6:]) for x in r2.text.split("\n") if x.startswith("data: {")]
        r3 = client.post("/v1/completions", json=_body(model, a, 4, stream=True))  # no usage: counted
    assert r1.status_code == r2.status_code == r3.status_code == 200
    assert r1.json()["usage"]["prompt_tokens"] == len(a) and r1.json()["usage"]["completion_tokens"] == 5
    usage = chunks[-1]["usage"]
    # the engine's own prefix cache saw B continue A's first two 32-token blocks
    assert usage["prompt_tokens"] == len(b) and usage["prompt_tokens_details"]["cached_tokens"] == 64
    assert r3.text.endswith("data: [DONE]\n\n") and "usage" not in r3.text
    s = cap.stop()
    assert (s["num_recorded"], s["num_errors"], s["num_skipped"], s["num_passthrough"]) == (3, 0, 0, 1)
    lines = read_lines(out)
    # a stream without usage: one token per chunk the client saw; 4, unless the engine merged tokens whose chunk
    # its server had not yet sent (vLLM does when its server lags: a loaded machine)
    num_chunks = sum(1 for x in r3.text.split("\n") if x.startswith("data: {") and json.loads(x[6:])["choices"])
    assert 1 <= num_chunks <= 4
    assert [(r["input_length"], r["output_length"]) for r in lines] == [(88, 5), (104, 3), (88, num_chunks)]
    # A: 6 blocks (5 full + 8 tokens); B shares A's 4 full blocks of the 64-token head; A again: A's ids
    assert lines[0]["hash_ids"] == [0, 1, 2, 3, 4, 5]
    assert lines[1]["hash_ids"] == [0, 1, 2, 3, 6, 7, 8]
    assert lines[2]["hash_ids"] == lines[0]["hash_ids"]
    # B does not continue A (it lacks A's fifth full block); A again is not longer than A: no parent
    assert [(r["parent_chat_id"], r["turn"]) for r in lines] == [(-1, 1)] * 3


@pytest.fixture(scope="module")
def slice_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small to-B synthetic slice (shared system prompts, multi-turn sessions), ingested."""
    d = tmp_path_factory.mktemp("capture_slice")
    kvtrace_cli("synth", "--profile", "to-b", "--seed", "3", "--requests", "400", "--duration", "120",
                "-o", str(d / "slice.jsonl"), "--quiet")
    kvtrace_cli("ingest", str(d / "slice.jsonl"), "-o", str(d / "run"), "--quiet")
    return d / "run"


def _canonical(requests: list[list[Any]]) -> list[list[int]]:
    """Block labels renumbered 0, 1, ... in order of first appearance: two traces have the same chained-block
    partition iff their canonical forms are equal."""
    seen: dict[Any, int] = {}
    return [[seen.setdefault(x, len(seen)) for x in labels] for labels in requests]


def test_replay_through_the_proxy_round_trips(cpu_engine: dict[str, Any], slice_run: Path, start_capture: Any,
                                              tmp_path: Path) -> None:
    from tongyi_trace.replay.records import read_records
    from tongyi_trace.run import open_run
    from tongyi_trace.sim.engine_model import engine_block_ids

    cap = start_capture(cpu_engine["url"], tmp_path / "captured.jsonl")
    # one request at a time: arrival order at the proxy is the replay's send order, request for request
    summary = json.loads(kvtrace_cli("replay", str(slice_run), "--server", cap.url, "--name", "rt", "--speedup",
                                     "8", "--max-in-flight", "1", "--max-output", "4", "--max-requests", "40",
                                     "--json"))
    s = cap.stop()
    assert summary["status"] == "complete" and summary["counts"]["num_error"] == 0
    assert summary["engine"]["block_size"] == ENGINE_BLOCK  # read from /metrics, through the proxy
    recs = read_records(slice_run / "replay" / "rt" / "records.jsonl").sort("sent_s")
    assert recs.height == 40 and s["num_recorded"] == 40 and s["num_errors"] == s["num_skipped"] == 0, s

    kvtrace_cli("ingest", str(tmp_path / "captured.jsonl"), "-o", str(tmp_path / "cap_run"), "--quiet")
    cap_run = open_run(tmp_path / "cap_run")
    assert (cap_run.provenance()["format"], cap_run.provenance()["block_size"]) == ("bailian", TRACE_BLOCK)
    cap_req = pl.read_parquet(cap_run.requests_path).sort("req_idx")
    cap_blocks = pl.read_parquet(cap_run.blocks_path).sort("req_idx", "pos")
    assert cap_req["input_tokens"].to_list() == recs["prompt_tokens"].to_list()
    assert cap_req["output_tokens"].to_list() == recs["output_tokens"].to_list()

    # What the replay sent (replay/prompts.py): request r's prompt is the tokens of its trace blocks, except
    # that from unique_from(r) on (the tokens its FULL 32-token engine blocks cover: sim/engine_model.py)
    # the tokens are request-unique filler, up to its input length. unique_from is a multiple of 32, hence
    # of 16: the captured 16-token blocks before it are the trace's blocks (equal tokens iff equal trace
    # block ids, chained alike), and every captured block from it on, the partial last one included, is the
    # request's own. That is the partition the captured trace must have, block for block.
    run = open_run(slice_run)
    req_idx = recs["req_idx"].to_numpy()
    _, unique_from = engine_block_ids(run.tables(), req_idx, ENGINE_BLOCK, recs["max_tokens"].to_numpy())
    blocks = pl.read_parquet(run.blocks_path).filter(pl.col("req_idx").is_in(req_idx.tolist()))
    by_req = {int(k[0]): g.sort("pos") for k, g in blocks.group_by("req_idx")}
    expected: list[list[Any]] = []
    for r, num_prompt, u in zip(req_idx.tolist(), recs["prompt_tokens"].to_list(), unique_from.tolist(), strict=True):
        num_shared = u // TRACE_BLOCK
        assert u % ENGINE_BLOCK == 0 and u <= num_prompt
        trace_blocks = by_req[r]
        assert (trace_blocks["num_tokens"].head(num_shared) == TRACE_BLOCK).all()
        expected.append([("trace", c) for c in trace_blocks["chain_idx"].head(num_shared).to_list()]
                        + [("own", r, k) for k in range(num_shared, -(-num_prompt // TRACE_BLOCK))])
    captured = [g.sort("pos")["chain_idx"].to_list() for _, g in cap_blocks.group_by("req_idx", maintain_order=True)]
    assert _canonical(captured) == _canonical(expected)

    # hence the same ideal hit ratio, exactly, in blocks (a block hits when an earlier request had it)
    num_refs = sum(map(len, expected))
    num_hits = num_refs - len({x for labels in expected for x in labels})
    assert num_hits > 100  # the slice shares system prompts and conversations: hits to check
    kvtrace_cli("analyze", str(tmp_path / "cap_run"), "--only", "hit_ratio", "--quiet")
    headline = json.loads((tmp_path / "cap_run" / "analysis" / "hit_ratio.json").read_text())["headline"]
    assert (headline["num_block_refs"], headline["num_hit_blocks"]) == (num_refs, num_hits)
    assert headline["hit_ratio"] == num_hits / num_refs

    # arrivals at the proxy keep the replay's send times. Each request's arrival at the proxy minus its send time
    # is one offset (the two clocks start apart); on a quiet machine every request is within 9 ms of the common
    # offset. The suite's other worker and the CPU engine's threads can hold both cores for a moment, which
    # makes a request arrive late (96 ms once, 0.24 s in one CI run for a few of 40), and a late arrival
    # spoils two inter-arrival gaps. So: half the requests within 10 ms of the common offset, three in four
    # within 50 ms, none early by more than 50 ms. A wrong unit or order of the timestamps misses by whole gaps
    # (0.03-0.2 s each) for most requests.
    offset_s = cap_req["arrival_s"].to_numpy() - recs["sent_s"].to_numpy()
    deviation_s = offset_s - np.median(offset_s)
    assert np.median(np.abs(deviation_s)) <= 0.010, deviation_s
    assert np.mean(np.abs(deviation_s) <= 0.050) >= 0.75 and deviation_s.min() >= -0.050, deviation_s

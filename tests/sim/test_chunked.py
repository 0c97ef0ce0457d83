"""The simulator in chunks (sim/chunked.py) against the whole-stream simulator, and the streamed sweep
(sim/streamed.py) against the whole-stream sweep: equal request for request, on a small real trace read
back from its run folder in chunks far smaller than a request's worth of references."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from tests.sim.conftest import synth_run
from tongyi_trace.budget import MemoryBudget
from tongyi_trace.errors import UsageError
from tongyi_trace.run import open_run
from tongyi_trace.sim.capacity import peak_live_blocks
from tongyi_trace.sim.chunked import iter_chunks, simulate_chunked, stream_shape, write_next_uses
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import load_stream, next_request_of_refs
from tongyi_trace.sim.streamed import plan_sweep


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 to-C requests over 10 minutes, ingested."""
    return synth_run(tmp_path_factory.mktemp("chunked"), 3, 400)


@pytest.mark.parametrize("chunk_refs", [1, 97, 10**9])
def test_chunks_cover_the_stream(small_run: Path, chunk_refs: int) -> None:
    run = open_run(small_run)
    st = load_stream(run.tables())
    shape = stream_shape(run)
    chunks = list(iter_chunks(run, shape, chunk_refs))
    assert chunks[0].first_req == 0 and chunks[-1].stop_req == st.num_requests
    assert all(a.stop_req == b.first_req and a.ref0 + a.blk.shape[0] == b.ref0 for a, b in itertools.pairwise(chunks))
    assert np.array_equal(np.concatenate([c.blk for c in chunks]), st.blk)  # chain_idx = load_stream's dense ids
    assert np.array_equal(np.concatenate([c.ntok for c in chunks]), st.ntok)
    assert np.array_equal(shape.req_tokens, st.req_tokens) and shape.num_ids == st.num_ids
    if chunk_refs == 1:  # whole requests: one a chunk (or a run of empty ones)
        assert len(chunks) >= np.count_nonzero(np.diff(st.req_off))


def test_next_uses_out_of_core(small_run: Path, tmp_path: Path) -> None:
    run = open_run(small_run)
    st = load_stream(run.tables())
    shape = stream_shape(run)
    peak = write_next_uses(run, shape, 113, tmp_path / "nxt.i64")
    want = next_request_of_refs(st.req_off, st.blk, st.num_ids)
    assert np.array_equal(np.fromfile(tmp_path / "nxt.i64", np.int64), want)
    assert peak == peak_live_blocks(st.req_off, want) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nxt.i64"]  # the spilled ids are gone


@pytest.mark.parametrize("policy, params", [("lru", None), ("s3fifo", None), ("oracle", None), ("fifo", None),
                                            ("gdsf", None), ("oracle", {"knows": "dead"})])
def test_chunked_equals_whole_stream(small_run: Path, policy: str, params: dict | None) -> None:
    run = open_run(small_run)
    st = load_stream(run.tables())
    for cap in (st.num_ids // 50, st.num_ids // 5):
        want = simulate_policy(st, policy, cap, params=params)
        got = simulate_chunked(run, policy, cap, chunk_refs=101, params=params)
        assert got.num_hits == want.num_hits > 0
        assert np.array_equal(got.req_hit_blocks, want.req_hit_blocks)
        assert np.array_equal(got.req_hit_tokens, want.req_hit_tokens)
        assert (got.num_evictions, got.num_bypassed, got.num_tokens, got.per_category) == \
            (want.num_evictions, want.num_bypassed, want.num_tokens, want.per_category)
    assert not list((small_run / "sim").glob("chunked-*"))  # spill removed (only the oracle makes one)


def test_wa_without_guard_in_chunks(small_run: Path, tmp_path: Path) -> None:
    from tongyi_trace.fit.policy_fit import fit_policy
    from tongyi_trace.policy.file import load_policy

    run = open_run(small_run)
    fit_policy(small_run, tmp_path / "policy.json", capacities=None)
    fit = load_policy(tmp_path / "policy.json")
    st = load_stream(run.tables(), context=fit.context)
    params = {"guard": False}
    want = simulate_policy(st, "wa", st.num_ids // 20, params=params, fit=fit)
    got = simulate_chunked(run, "wa", st.num_ids // 20, chunk_refs=89, params=params, fit=fit)
    assert np.array_equal(got.req_hit_blocks, want.req_hit_blocks) and got.num_hits == want.num_hits
    with pytest.raises(UsageError, match="guard"):
        simulate_chunked(run, "wa", 100, chunk_refs=89, fit=fit)
    with pytest.raises(UsageError, match="lfu"):
        simulate_chunked(run, "lfu", 100, chunk_refs=89)


def test_plan_sweep() -> None:
    small = plan_sweep(10**6, 4 * 10**5, 10**4, 8, 2, MemoryBudget(4.0), streamable=True)
    assert small == plan_sweep(10**6, 4 * 10**5, 10**4, 8, 2, MemoryBudget(4.0), streamable=False)
    assert not small.streamed and small.jobs == 2 and small.notes == ()
    one = plan_sweep(10**7, 15 * 10**6, 10**5, 8, 2, MemoryBudget(4.0), streamable=True)  # 2 GiB a policy
    assert not one.streamed and one.jobs == 1 and "1 of 2 simulations at once" in one.notes[0]
    big = plan_sweep(10**8, 4 * 10**7, 10**6, 8, 2, MemoryBudget(4.0), streamable=True)
    assert big.streamed and big.jobs == 1 and "streamed" in big.notes[0]
    assert not plan_sweep(10**8, 4 * 10**7, 10**6, 8, 2, MemoryBudget(4.0), streamable=False).streamed


def test_streamed_sweep_equals_the_sweep(small_run: Path, private_run, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tongyi_trace.cli import app
    from tongyi_trace.sim import streamed

    run = private_run(small_run)
    args = ["simulate", str(run), "-p", "lru,s3fifo,oracle", "-c", "2%,1L", "--json", "-q", "--no-intervals"]
    whole = CliRunner().invoke(app, args)
    assert whole.exit_code == 0, whole.output
    monkeypatch.setattr(streamed, "WHOLE_BYTES_PER_REF", 10**5)  # the small trace no longer fits: streamed
    part = CliRunner().invoke(app, [*args, "--memory-limit-gib", "1"])
    assert part.exit_code == 0, part.output
    a, b = json.loads(whole.stdout), json.loads(part.stdout)
    assert b["summary"]["memory"]["streamed"] and not a["summary"]["memory"]["streamed"]
    assert b["summary"]["peak_live_blocks"] == a["summary"]["peak_live_blocks"]
    keys = ("policy", "capacity", "capacity_blocks", "num_hits", "num_hit_tokens", "num_evictions", "qttft_mean_s")
    assert [{k: r[k] for k in keys} for r in b["rows"]] == [{k: r[k] for k in keys} for r in a["rows"]]
    assert b["summary"]["memory"]["jobs"] > 1  # passes of several simulations, served side by side
    assert not [p for p in (run / "sim").iterdir() if p.is_dir() and p.name.startswith(("streamed-", "chunked-"))]


@pytest.mark.parametrize("limit_gib", [0.5, 1.0, 3.0, 64.0])
def test_passes_hold_every_task_once_smallest_first_within_the_budget(limit_gib: float) -> None:
    """A streamed sweep's passes: every task once, capacities never decreasing, each pass within the budget
    with every task at its own capacity (pass_fits; a task alone always makes one) and at most MAX_PER_PASS,
    and as wide as it may be: the next task would not fit beside it."""
    from types import SimpleNamespace

    from tongyi_trace.sim.streamed import MAX_PER_PASS, pass_fits, passes

    shape = SimpleNamespace(num_ids=5_000_000, num_requests=40_000)
    caps = [SimpleNamespace(num_blocks=n) for n in (2_000_000, 50_000, 400_000, 50_000, 2_000_000, 400_000)]
    tasks = [(f"p{i}", c) for i, c in enumerate(caps * 3)]
    budget = MemoryBudget(limit_gib)
    groups = passes(tasks, lambda t: t[-1].num_blocks, shape.num_ids, shape.num_requests, budget)
    assert sorted(t[0] for g in groups for t in g) == sorted(t[0] for t in tasks)
    flat = [t[-1].num_blocks for g in groups for t in g]
    assert flat == sorted(flat)
    for g, after in zip(groups, [*groups[1:], []], strict=True):
        blocks = [t[-1].num_blocks for t in g]
        assert 1 <= len(g) <= MAX_PER_PASS and (len(g) == 1 or pass_fits(blocks, shape.num_ids,
                                                                           shape.num_requests, budget))
        if after and len(g) < MAX_PER_PASS:
            assert not pass_fits([*blocks, after[0][-1].num_blocks], shape.num_ids, shape.num_requests, budget)
    assert len(groups) > 1 if limit_gib < 64 else len(groups) == -(-len(tasks) // MAX_PER_PASS)
    # each task at its own capacity: small ones beside a large one where width x the largest would not fit
    big, small = 2_000_000, 50_000
    room = MemoryBudget(1.6)  # 1.3 GiB for the first pair, 2.0 for the second
    assert pass_fits([small, big], shape.num_ids, shape.num_requests, room)
    assert not pass_fits([big, big], shape.num_ids, shape.num_requests, room)
    assert [len(g) for g in passes([small, big], int, shape.num_ids, shape.num_requests, room)] == [2]
    # what the process holds already counts: a fit that read its run first gets narrower passes
    held = 1 << 30
    assert [len(g) for g in passes([small, big], int, shape.num_ids, shape.num_requests, room, held_bytes=held)] \
        == [1, 1]


def test_window_and_pass_in_chunks(small_run: Path, tmp_path: Path) -> None:
    """A window of the run (requests lo..hi-1 from a cold cache: what fit/tune.py replays when streamed) in
    chunks equals simulate_policy over load_stream of those requests, request for request, also read from a
    blocks.parquet of many row groups (those before the window are skipped); one pass of several policies
    (simulate_chunked_many) equals each alone."""
    import shutil

    import pyarrow.parquet as pq

    from tongyi_trace.fit.policy_fit import fit_policy
    from tongyi_trace.policy.file import load_policy
    from tongyi_trace.sim.chunked import ChunkedTask, _row_groups, simulate_chunked_many

    fit_policy(small_run, tmp_path / "policy.json", capacities=None)
    fit = load_policy(tmp_path / "policy.json")
    grouped = tmp_path / "run"
    shutil.copytree(small_run, grouped, ignore=shutil.ignore_patterns("fit", "sim", "analysis"))
    pq.write_table(pq.read_table(small_run / "blocks.parquet"), grouped / "blocks.parquet", row_group_size=500)
    n = open_run(small_run).requests().height
    lo, hi = n // 3, n - 7
    st = load_stream(open_run(small_run).tables(), np.arange(lo, hi), fit.context)
    cap = st.num_ids // 10
    tasks = [ChunkedTask("lru", cap), ChunkedTask("s3fifo", cap), ChunkedTask("wa", cap // 2, {"guard": False})]
    wants = [simulate_policy(st, t.policy, t.capacity_blocks, params=t.params, fit=fit) for t in tasks]
    pf = pq.ParquetFile(grouped / "blocks.parquet")
    assert 0 < len(_row_groups(pf, lo, hi)) < pf.metadata.num_row_groups
    for folder in (small_run, grouped):
        got = simulate_chunked_many(open_run(folder), tasks, chunk_refs=97, fit=fit, requests=(lo, hi))
        for want, g in zip(wants, got, strict=True):
            assert g.num_hits == want.num_hits > 0 and g.num_refs == want.num_refs == st.num_refs
            assert np.array_equal(g.req_hit_blocks, want.req_hit_blocks)
            assert g.mean_eviction_age_s == pytest.approx(want.mean_eviction_age_s)
            assert (g.num_evictions, g.num_tokens, g.per_category) == \
                (want.num_evictions, want.num_tokens, want.per_category)
    alone = simulate_chunked(open_run(grouped), "s3fifo", cap, chunk_refs=10**9, fit=fit, requests=(lo, hi))
    assert np.array_equal(alone.req_hit_blocks, wants[1].req_hit_blocks)
    with pytest.raises(UsageError, match="not within"):
        simulate_chunked(open_run(small_run), "lru", cap, chunk_refs=97, requests=(lo, n + 1))

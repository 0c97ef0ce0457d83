"""The simulator's state per cache slot (sim/structs.py, Cache(slotted=True): the chunked simulator's)
against its state per block id: the same results request for request, on a real synthetic trace, with
a state whose rows are bounded by the capacity and the policy's ghost, not by the distinct blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.sim.conftest import synth_run
from tongyi_trace.policy.file import PolicyParams
from tongyi_trace.run import open_run
from tongyi_trace.sim.kernel import S_BYPASS, S_EVICTIONS, S_TOUCHED
from tongyi_trace.sim.registry import get_policy
from tongyi_trace.sim.simulate import Cache, EngineShape
from tongyi_trace.sim.stream import Stream, load_stream
from tongyi_trace.sim.structs import G_FREE, HVER, make_slots, make_state, slots_for


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 to-C requests over 10 minutes, ingested."""
    return synth_run(tmp_path_factory.mktemp("slots"), 7, 300)


@pytest.fixture(scope="module")
def stream(run_dir: Path) -> Stream:
    return load_stream(open_run(run_dir).tables())


@pytest.fixture(scope="module")
def fit(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PolicyParams:
    from tongyi_trace.fit.policy_fit import fit_policy
    from tongyi_trace.policy.file import load_policy

    out = tmp_path_factory.mktemp("slots-fit") / "policy.json"
    fit_policy(run_dir, out, capacities=None)
    return load_policy(out)


def _pair(stream: Stream, policy: str, cap: int, **kw: Any) -> tuple[Cache, Cache]:
    """The same cache per block and per slot, each fed the whole stream in three slices (the state is
    carried between calls, as the chunked simulator's)."""
    caches = (Cache(stream, policy, cap, timing=False, **kw),
              Cache(stream, policy, cap, timing=False, slotted=True, **kw))
    n = stream.num_requests
    for c in caches:
        for lo, hi in ((0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n)):
            c.serve(lo, hi)
    return caches


def _assert_same(a: Cache, b: Cache) -> None:
    ra, rb = a.result(), b.result()
    assert ra.num_hits > 0 and ra.num_evictions > 0  # the capacity is small enough to evict
    assert np.array_equal(ra.req_hit_blocks, rb.req_hit_blocks)
    assert np.array_equal(ra.req_hit_tokens, rb.req_hit_tokens)
    assert np.array_equal(a.stats, b.stats)  # every counter: evictions, bypass, touched, orphaned, parked...
    assert ra.per_category == rb.per_category and ra.mean_eviction_age_s == rb.mean_eviction_age_s
    assert a.num_cached == b.num_cached


def _assert_bounded(c: Cache, stream: Stream) -> None:
    """The state per slot has at most capacity + retained + an eighth rows, far fewer than the ids, and
    every slot is either free or held by the one block that maps to it."""
    assert c.num_rows < stream.num_ids // 2
    assert c.state[0].shape[0] - c.state[4].shape[0] == c.num_rows  # bk's rows are the slots (and sentinels)
    assert c.state[5].shape[1] == c.num_rows + 2
    sid = c.sl[0]
    held = np.flatnonzero(sid >= 0)
    assert np.array_equal(c.imap[sid[held]], held)  # each held slot's block maps back to it
    assert np.count_nonzero(c.imap < c.num_rows) == held.size  # and no other id has a slot
    assert c.state[2][G_FREE] + held.size <= c.num_rows
    assert held.size >= c.num_cached


@pytest.mark.parametrize("policy, params", [
    ("lru", {}), ("lru", {"leaf_only": True}), ("fifo", {}), ("s3fifo", {}), ("s3fifo", {"leaf_only": True}),
    ("oracle", {}), ("oracle", {"knows": "dead"}), ("gdsf", {}), ("gdsf", {"leaf_only": True})])
def test_slots_equal_blocks(stream: Stream, policy: str, params: dict[str, Any]) -> None:
    for cap in (stream.num_ids // 60, stream.num_ids // 12):
        a, b = _pair(stream, policy, cap, params=params)
        _assert_same(a, b)
        _assert_bounded(b, stream)
        # the rows the streamed planner counts for it (sim/streamed.py passes) are the rows it has
        assert b.num_rows == slots_for(cap, get_policy(policy).retained_blocks(params, cap), stream.num_ids)
        if policy == "s3fifo":  # the ghost's slots are kept: more rows than the cache, within slots_for's
            assert b.num_rows == slots_for(cap, int(0.9 * cap), stream.num_ids) > cap
        else:
            assert get_policy(policy).retained_blocks(params, cap) == 0


def test_slots_equal_blocks_wa(run_dir: Path, fit: PolicyParams) -> None:
    """WA's per-category queues, and its last tie-break (the block id, structs.BID, not the slot)."""
    st = load_stream(open_run(run_dir).tables(), context=fit.context)
    for params in ({"guard": False}, {"guard": False, "leaf_only": False}):
        a, b = _pair(st, "wa", st.num_ids // 30, params=params, fit=fit)
        _assert_same(a, b)
        _assert_bounded(b, st)


def test_slots_with_engine_shape(stream: Stream) -> None:
    """vLLM's last-token rule and a slot held while running (the kernel's extra pass) per slot too."""
    lens = np.diff(stream.req_off)
    engine = EngineShape(np.maximum(lens - 1, 0), lens, np.ones(stream.num_requests, np.int64))
    for policy in ("lru", "s3fifo", "oracle"):
        a, b = _pair(stream, policy, stream.num_ids // 40, engine=engine)
        _assert_same(a, b)


def test_every_reference_is_counted_once(stream: Stream) -> None:
    """hits + misses = references: a miss is cached anyway (touched), inserted (cached now or evicted
    since) or bypassed, whatever the state."""
    for policy in ("lru", "s3fifo", "oracle"):
        _, c = _pair(stream, policy, stream.num_ids // 60)
        r = c.result()
        inserted = int(c.stats[S_EVICTIONS]) + c.num_cached
        misses = int(c.stats[S_TOUCHED]) + int(c.stats[S_BYPASS]) + inserted
        assert r.num_hits + misses == r.num_refs == stream.num_refs


def test_make_slots() -> None:
    """make_slots hands out slots 0, 1, ... all free, each mapped to no id (the first sentinel row)."""
    bk, _, g, _, _, _ = make_state(5, 1, 8, np.zeros(0, np.int64), np.zeros(0))
    imap, sl = make_slots(100, 5, g)
    assert g[G_FREE] == 5 and list(sl[1, :5][::-1]) == [0, 1, 2, 3, 4] and (sl[0] == -1).all()
    assert (imap == 5).all() and bk[5, 0] == 0 and (bk[:, HVER] == 0).all()


def test_slots_for() -> None:
    assert slots_for(1000, 900, 10**6) == 1901 + 1901 // 8
    assert slots_for(10, 0, 10**6) == 11 + 64
    assert slots_for(10**6, 0, 5000) == 5000  # never more rows than ids

"""The oracle that knows only which blocks are dead (`oracle-dead`): golden hits by hand, the bounds it sits
between, and the CLI variant."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import UsageError
from tongyi_trace.sim.recommend import NOT_DEPLOYABLE
from tongyi_trace.sim.simulate import simulate_policy
from tongyi_trace.sim.stream import stream_from_lists

DEAD = {"knows": "dead"}
# one block a request, capacity 2: r0 [2]; r1 [1]; r2 [4]; r3 [2]; r4 [1]; r5 [4]
TIMING = [[2], [1], [4], [2], [1], [4]]


@pytest.mark.parametrize(("params", "hits"), [
    # LRU order and nothing else: r2 evicts 2, r3 evicts 1, r4 evicts 4, r5 evicts 2. Hits 0.
    (None, None),
    # knows dead: r2: 2 (next r3) and 1 (next r4) both live -> LRU evicts 2; r3 [2] misses, 1 and 4 live
    # -> LRU evicts 1; 2 is now dead (never used again); r4 [1] misses and evicts the dead 2, not 4;
    # r5 hits 4. Hits 1.
    (DEAD, 1),
    # Belady: r2 evicts 1 (next use r4, after 2's r3); r3 hits 2, which is then dead; r4 evicts 2;
    # r5 hits 4. Hits 2.
    ({}, 2),
])
def test_knowing_whether_a_block_returns_sits_between_lru_and_belady(params: dict | None, hits: int | None) -> None:
    stream = stream_from_lists(TIMING)
    if params is None:
        assert simulate_policy(stream, "lru", 2).num_hits == 0
        return
    res = simulate_policy(stream, "oracle", 2, params=params)
    assert (res.num_refs, res.num_hits) == (6, hits)


def test_dead_first_keeps_the_cache_prefix_closed_and_under_belady() -> None:
    rng = random.Random(7)
    for _ in range(200):
        reqs = []
        for _ in range(rng.randint(3, 12)):  # a shared head, then a part of that head's own chain
            h, head = rng.choice([(1, [1, 2]), (2, [1, 3]), (3, [5])])
            reqs.append(head + [100 * h + k for k in range(rng.randint(0, 3))])
        stream = stream_from_lists(reqs)
        for cap in (2, 3, 5):
            dead = simulate_policy(stream, "oracle", cap, params=DEAD)
            belady = simulate_policy(stream, "oracle", cap)
            assert dead.num_hits <= belady.num_hits
            assert dead.orphaned_refs == 0  # never a cached block under an evicted parent


def test_unknown_knowledge_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="knows must be one of future, dead"):
        simulate_policy(stream_from_lists(TIMING), "oracle", 2, params={"knows": "tomorrow"})


def test_simulate_oracle_dead_variant(make_run: Callable[..., Path]) -> None:
    run = make_run(TIMING)
    res = CliRunner().invoke(app, ["simulate", str(run), "-p", "lru,oracle-dead,oracle", "-c", "2", "--json",
                                   "-j", "1"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["policy"], r["num_hits"], r["params"].get("knows")) for r in rows] == [
        ("lru", 0, None), ("oracle-dead", 1, "dead"), ("oracle", 2, "future")]
    assert "oracle-dead" in NOT_DEPLOYABLE  # a bound: never recommended

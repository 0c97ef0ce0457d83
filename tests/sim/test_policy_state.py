"""Each policy owns its share of the simulator state (policy_base.StateDecl, its init hook); the heap the
GDSF and ORACLE policies share keeps its documented order; the registry names a colour for every policy."""

from __future__ import annotations

import numpy as np
import pytest

from tongyi_trace.sim.policy_base import InitContext, StateDecl
from tongyi_trace.sim.registry import COLORS, FITTED, REGISTRY, WA_ABLATION, Policy
from tongyi_trace.sim.stream import stream_from_lists
from tongyi_trace.sim.structs import (
    G_POLICY,
    NUM_ROWS,
    POLICY_COL0,
    PRESENT,
    heap_pop_valid,
    heap_push,
    make_state,
)


@pytest.mark.parametrize("policy", list(Policy))
def test_a_policy_declares_its_state_within_its_share(policy: Policy) -> None:
    hooks = REGISTRY[policy].hooks
    decl: StateDecl = hooks.STATE
    cols = [decl.col(n) for n in decl.columns]
    assert len(set(cols)) == len(cols) and all(POLICY_COL0 <= c < NUM_ROWS for c in cols)
    assert all(decl.slot(n) >= G_POLICY for n in decl.slots)
    stream = stream_from_lists([[1, 2, 3], [1, 2, 4], [5]], times_s=[0.0, 1.0, 2.0], categories=["a", "b", "a"])
    typed, _ = REGISTRY[policy].make_params({})
    setup = hooks.init(typed, InitContext(stream, 2))
    assert setup.ip.shape == (8,) and setup.fp.shape == (8,)
    assert len(setup.g0) >= len(decl.slots) and len(setup.gf0) >= len(decl.fslots)
    assert setup.num_queues >= 1


def test_a_policy_may_not_declare_more_columns_than_its_share() -> None:
    with pytest.raises(ValueError, match="at most"):
        StateDecl(columns={f"C{i}": "" for i in range(NUM_ROWS - POLICY_COL0 + 1)})


def test_heap_pops_by_key_then_push_order_and_skips_stale_entries() -> None:
    bk, hp, g, _, _, _ = make_state(8, 1, 16, np.zeros(0, np.int64), np.zeros(0))
    bk[:8, PRESENT] = 1
    for x, key in [(1, 5), (2, 5), (3, 3), (4, 7), (3, 9), (0, 5)]:  # block 3's first entry becomes stale
        heap_push(bk, hp, g, x, key)
    popped = [heap_pop_valid(bk, hp, g) for _ in range(6)]
    assert popped == [(1, 5), (2, 5), (0, 5), (4, 7), (3, 9), (-1, 0)]


def test_heap_compacts_when_full_and_keeps_the_order() -> None:
    bk, hp, g, _, _, _ = make_state(4, 1, 6, np.zeros(0, np.int64), np.zeros(0))
    bk[:4, PRESENT] = 1
    for k in range(20):  # 20 pushes into 6 entries: only each block's newest entry survives compaction
        heap_push(bk, hp, g, k % 4, 100 - k)
    assert [heap_pop_valid(bk, hp, g)[0] for _ in range(5)] == [3, 2, 1, 0, -1]


def test_every_policy_and_variant_has_a_colour() -> None:
    assert {*Policy, *WA_ABLATION, FITTED} <= set(COLORS)
    assert len(set(COLORS.values())) == len(COLORS)

"""The QTTFT cost model and capacity parsing, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tongyi_trace.errors import UsageError
from tongyi_trace.models import get_preset
from tongyi_trace.sim.capacity import parse_capacities, peak_live_blocks
from tongyi_trace.sim.cost_model import CostModel, preset_cost, qttft_s, summarize_qttft
from tongyi_trace.sim.stream import next_request_of_refs, stream_from_lists


def test_fifo_queue_by_hand() -> None:
    m = CostModel("t", overhead_s=1.0, s_per_token=0.1, s_per_loaded_token=0.01)
    # arrivals 0, 1, 10; uncached 10, 0, 20 tokens -> prefill 2, 1, 3 s
    # r0: 0..2 (2); r1 waits to 2, ends 3 (2); r2: 10..13 (3)
    q = qttft_s(m, np.array([0.0, 1.0, 10.0]), np.array([10, 0, 20]))
    assert q.tolist() == pytest.approx([2.0, 2.0, 3.0])
    # 100 tokens loaded from the CPU tier add 1 s to r0 and delay r1 by the same
    q = qttft_s(m, np.array([0.0, 1.0, 10.0]), np.array([10, 0, 20]), np.array([100, 0, 0]))
    assert q.tolist() == pytest.approx([3.0, 3.0, 3.0])
    assert summarize_qttft(np.array([1.0, 3.0]))["qttft_mean_s"] == 2.0


def test_preset_cost_from_flops() -> None:
    m = preset_cost("qwen2-7b")
    assert m.s_per_token == pytest.approx(2 * 7.6e9 / (312e12 * 0.5))
    assert m.s_per_loaded_token == pytest.approx(57344 / 25e9)


def test_capacities() -> None:
    qwen = get_preset("qwen2-7b")
    caps = parse_capacities("4096, 5%,1x,0.5L,inf", num_distinct=1000, block_size_tokens=16, model=qwen,
                            peak_live=300)
    assert [c.num_blocks for c in caps] == [4096, 50, qwen.hbm_blocks(16), 150, 1000]
    with pytest.raises(UsageError, match="at least 1"):
        parse_capacities("0.01%", num_distinct=10, block_size_tokens=16, model=None)
    with pytest.raises(UsageError, match="peak live set is 0: no block of this trace is ever reused"):
        parse_capacities("1L", num_distinct=10, block_size_tokens=16, model=None, peak_live=0)
    with pytest.raises(UsageError, match="--model"):
        parse_capacities("1x", num_distinct=10, block_size_tokens=16, model=None)


def test_peak_live_set() -> None:
    # r0 [1,2]; r1 [3]; r2 [1,2]; r3 [4]; r4 [3]: after r0: 1,2 live; after r1: 1,2,3 (peak 3); after r2: 3.
    s = stream_from_lists([[1, 2], [3], [1, 2], [4], [3]])
    assert peak_live_blocks(s.req_off, next_request_of_refs(s.req_off, s.blk, s.num_ids)) == 3

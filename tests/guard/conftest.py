"""A small shifted stream: a hot working set and one-off scans, their category labels swapped at T_SHIFT_S."""

from __future__ import annotations

import pytest

from tongyi_trace.policy.file import CategoryParams, PolicyParams
from tongyi_trace.sim.stream import Stream, stream_from_lists

T_SHIFT_S = 600.0
NUM_HOT, LEN = 10, 8
CAPACITY = 200  # LRU keeps the hot set (reuse distance 2 x 10 x 8 = 160 blocks), not every scan


def shifted(swap: bool = True) -> Stream:
    """One request a second for 2 x T_SHIFT_S: even seconds a hot session (one of NUM_HOT prefixes,
    reused every 20 s), odd seconds a scan of fresh blocks. Labels: hot = "a", scan = "b"; after the
    shift (SWAP) hot = "b", scan = "a"."""
    reqs, cats, times = [], [], []
    fresh = 10**6
    for t in range(int(2 * T_SHIFT_S)):
        late = swap and t >= T_SHIFT_S
        if t % 2 == 0:
            h = (t // 2) % NUM_HOT
            reqs.append([h * 100 + k for k in range(LEN)])
            cats.append("b" if late else "a")
        else:
            reqs.append(list(range(fresh, fresh + LEN)))
            fresh += LEN
            cats.append("a" if late else "b")
        times.append(float(t))
    return stream_from_lists(reqs, categories=cats, times_s=times)


def _cat(p: float, rate: float) -> CategoryParams:
    return CategoryParams(reuse_prob=p, rate_per_s=rate, mean_reuse_s=1 / rate, life_s=30.0)


@pytest.fixture
def first_hour_fit() -> PolicyParams:
    """What a fit of the first half says: "a" is reused (p 0.9), "b" almost never."""
    return PolicyParams(categories={"a": _cat(0.9, 0.01), "b": _cat(0.01, 0.001)}, default=_cat(0.5, 0.01))

"""Session affinity (vLLM production-stack's session router): a conversation sticks to the instance its
id hashes to on a consistent-hash ring (VNODES points per instance); when that instance's outstanding
work exceeds the least loaded one's by more than SATURATION_S seconds, the conversation moves to the
least loaded instance and stays there."""

from __future__ import annotations

from typing import Any

import numpy as np

from tongyi_trace.fleet.routers.base import FleetView, check_params, least_loaded_of
from tongyi_trace.splitmix import mix64

MASK = (1 << 64) - 1


class SessionAffinity:
    """Sticky by conversation, consistent hashing, rebalanced on saturation."""

    name = "session"
    uses_index = False

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        p = check_params(self.name, params or {}, {"saturation_s": float, "vnodes": int})
        self.saturation_s = float(p.get("saturation_s", 5.0))
        self.vnodes = max(int(p.get("vnodes", 64)), 1)
        self.ring_keys = np.zeros(0, np.uint64)
        self.ring_inst = np.zeros(0, np.int64)
        self.moved: dict[int, int] = {}
        self.homes: dict[tuple[int, int], int] = {}  # (session, instances) -> home, as computed once

    def _ring(self, n: int) -> None:
        pts = [(mix64(i * 1_000_003 + v), i) for i in range(n) for v in range(self.vnodes)]
        pts.sort()
        self.ring_keys = np.array([k for k, _ in pts], np.uint64)
        self.ring_inst = np.array([i for _, i in pts], np.int64)

    def home(self, session: int, n: int) -> int:
        """The instance SESSION hashes to on a ring of N instances."""
        got = self.homes.get((session, n))
        if got is None:
            if self.ring_inst.size != n * self.vnodes:
                self._ring(n)
            k = np.searchsorted(self.ring_keys, np.uint64(mix64(session & MASK)))
            got = self.homes[(session, n)] = int(self.ring_inst[k % self.ring_inst.size])
        return got

    def choose(self, r: int, view: FleetView) -> int:
        """The conversation's instance, unless it is saturated."""
        s = view.session(r)
        i = self.moved.get(s)
        if i is None:
            i = self.home(s, view.num_instances)
        work = view.outstanding_s(r)
        if work[i] - work.min() > self.saturation_s:
            i = least_loaded_of(view, r)
            self.moved[s] = i
        return i

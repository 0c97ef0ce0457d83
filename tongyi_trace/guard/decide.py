"""The guard's switch rule, shared by the simulator's driver and the vLLM plugin.

Two shadow caches run on the sampled blocks (sampling.py), one in LRU order and one under the policy;
after each step (a slice of requests in the simulator, a request in the engine) the caller reports the
sampled references and each shadow's hits. Over the last `window_s` seconds of trace time:

    mode policy -> lru    when LRU's hit ratio exceeds the policy's by more than `margin_points`
    mode lru -> policy    when the policy's hit ratio exceeds LRU's (it is ahead again)

and a rule is tested only once a full window has passed since the start or the last switch (each
decision rests on a full window of evidence, which also damps flapping). Every switch is kept with
both estimates.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

POLICY, LRU = "policy", "lru"


@dataclass(frozen=True)
class Switch:
    """One switch of the guard: when, to which mode, and the two windowed hit ratios that decided it."""

    time_s: float
    to_mode: str
    policy_hit_ratio: float
    lru_hit_ratio: float


class Guard:
    """The switch rule over windowed shadow hit ratios (see the module doc)."""

    def __init__(self, margin_points: float, window_s: float) -> None:
        self.margin = margin_points / 100.0
        self.window_s = window_s
        self.mode = POLICY
        self.switches: list[Switch] = []
        self.time_in_mode_s = {POLICY: 0.0, LRU: 0.0}
        self._steps: deque[tuple[float, int, int, int]] = deque()  # (time_s, refs, policy hits, lru hits)
        self._sums = [0, 0, 0]
        self._since_s: float | None = None  # start of the evidence: first step or last switch
        self._last_s: float | None = None

    def estimates(self) -> tuple[float, float, int]:
        """(policy hit ratio, LRU hit ratio, sampled references) over the current window."""
        refs, ph, lh = self._sums
        return (ph / refs, lh / refs, refs) if refs else (0.0, 0.0, 0)

    def observe(self, time_s: float, refs: int, policy_hits: int, lru_hits: int) -> Switch | None:
        """Report one step ending at TIME_S (sampled REFS and the shadows' hits); the switch, if any."""
        if self._since_s is None:
            self._since_s = time_s
        if self._last_s is not None:
            self.time_in_mode_s[self.mode] += max(time_s - self._last_s, 0.0)
        self._last_s = time_s
        self._steps.append((time_s, refs, policy_hits, lru_hits))
        self._sums = [self._sums[0] + refs, self._sums[1] + policy_hits, self._sums[2] + lru_hits]
        while self._steps and self._steps[0][0] <= time_s - self.window_s:
            _, r, p, q = self._steps.popleft()
            self._sums = [self._sums[0] - r, self._sums[1] - p, self._sums[2] - q]
        if time_s - self._since_s < self.window_s:
            return None
        pol, lru, n = self.estimates()
        if n == 0:
            return None
        if (self.mode == POLICY and lru - pol > self.margin) or (self.mode == LRU and pol > lru):
            self.mode = LRU if self.mode == POLICY else POLICY
            sw = Switch(time_s, self.mode, pol, lru)
            self.switches.append(sw)
            self._since_s = time_s
            return sw
        return None

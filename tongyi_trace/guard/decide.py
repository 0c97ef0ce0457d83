"""The guard's switch rule, shared by the simulator's driver and the vLLM plugin.

Two shadow caches run on the sampled blocks (sampling.py), one in LRU order and one under the policy;
after each step (a slice of requests in the simulator, a request in the engine) the caller reports the
sampled references and each shadow's hits. Over the last `window_s` seconds of trace time:

    mode policy -> lru    when LRU's hit ratio exceeds the policy's by more than `margin_points`
    mode lru -> policy    when the policy's hit ratio exceeds LRU's (it is ahead again)

and each difference must also be significant: D = sum(lru hits - policy hits) / sum(refs) over the
window's steps, its variance estimated from the steps as a ratio estimator's,
var(D) = n/(n-1) sum_i (x_i - D r_i)^2 / (sum_i r_i)^2 with x_i the step's hit difference and r_i its
references, and |D| / sqrt(var(D)) >= Z_CRIT (Z_CRIT_BACK to switch back). On the sampled sub-stream
the two estimates are noisy (a few hundred references a minute at 1/32), and without this test the
guard flips on noise. A rule is
tested only once a full window has passed since the start or the last switch (each decision rests on a
full window of evidence). Every switch is kept with both estimates.

The callers report steps only once the LRU shadow has evicted (the caches are warm): while a cache
fills, both orders hold everything and the difference is noise, and a switch then (measured: at 142 s on
the to-C bench) costs minutes of the policy's gain before the evidence turns it back.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

POLICY, LRU = "policy", "lru"
Z_CRIT = 2.0  # standard errors LRU's lead must exceed to switch to LRU
Z_CRIT_BACK = 2.0  # and the policy's lead to switch back (the same bar)


@dataclass(frozen=True)
class GuardSettings:
    """The guard's and the refit's parameters, as WA's (tongyi_trace.sim.policies.wa.WaParams) name them,
    with their defaults; `check()` is their one validation (WaParams and the vLLM plugin call it)."""

    guard: bool = False
    guard_margin: float = 0.2
    guard_window_s: float = 120.0
    refit_s: float = 0.0
    window_s: float = 600.0
    sample_rate: float = 1 / 32

    def check(self) -> None:
        """Raise UsageError naming the first parameter out of range."""
        from tongyi_trace.errors import UsageError

        for name in ("guard_margin", "guard_window_s", "refit_s", "window_s"):
            v = getattr(self, name)
            if not (v >= 0.0 and v < float("inf")):
                raise UsageError(f"policy wa: parameter {name} must be a finite number >= 0, got {v}")
        if self.guard_window_s <= 0.0 or self.window_s <= 0.0:
            raise UsageError("policy wa: parameters guard_window_s and window_s must be > 0 seconds, got "
                             f"{self.guard_window_s} and {self.window_s}")
        if not 0.0 < self.sample_rate <= 1.0:
            raise UsageError(f"policy wa: parameter sample_rate must be in (0, 1], got {self.sample_rate}")

    @property
    def active(self) -> bool:
        """Whether the guard or the refit is on."""
        return self.guard or self.refit_s > 0


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
        self._moments = [0.0, 0.0, 0.0]  # sums of x^2, x r, r^2 over the window (x = lru hits - policy hits)
        self._since_s: float | None = None  # start of the evidence: first step or last switch
        self._last_s: float | None = None

    def estimates(self) -> tuple[float, float, int]:
        """(policy hit ratio, LRU hit ratio, sampled references) over the current window."""
        refs, ph, lh = self._sums
        return (ph / refs, lh / refs, refs) if refs else (0.0, 0.0, 0)

    def _add(self, sign: int, step: tuple[float, int, int, int]) -> None:
        _, r, p, q = step
        x = q - p
        self._sums = [self._sums[0] + sign * r, self._sums[1] + sign * p, self._sums[2] + sign * q]
        m = self._moments
        self._moments = [m[0] + sign * x * x, m[1] + sign * x * r, m[2] + sign * r * r]

    def z_score(self) -> float:
        """D / its standard error over the window (D = LRU's hit ratio minus the policy's; see the module
        doc); +-inf when the steps agree exactly, 0 without a difference."""
        refs, ph, lh = self._sums
        d = (lh - ph) / refs if refs else 0.0
        n = len(self._steps)
        if d == 0.0 or n < 2:
            return 0.0
        xx, xr, rr = self._moments
        ss = max(xx - 2 * d * xr + d * d * rr, 0.0)  # sum (x_i - d r_i)^2
        var = ss * n / (n - 1) / refs**2
        return d / math.sqrt(var) if var > 0 else math.copysign(math.inf, d)

    def observe(self, time_s: float, refs: int, policy_hits: int, lru_hits: int) -> Switch | None:
        """Report one step ending at TIME_S (sampled REFS and the shadows' hits); the switch, if any."""
        if self._since_s is None:
            self._since_s = time_s
        if self._last_s is not None:
            self.time_in_mode_s[self.mode] += max(time_s - self._last_s, 0.0)
        self._last_s = time_s
        self._add(1, (time_s, refs, policy_hits, lru_hits))
        self._steps.append((time_s, refs, policy_hits, lru_hits))
        while self._steps and self._steps[0][0] <= time_s - self.window_s:
            self._add(-1, self._steps.popleft())
        if time_s - self._since_s < self.window_s:
            return None
        pol, lru, n = self.estimates()
        if n == 0:
            return None
        z = self.z_score()
        if (self.mode == POLICY and lru - pol > self.margin and z >= Z_CRIT) or (
                self.mode == LRU and pol > lru and z <= -Z_CRIT_BACK):
            self.mode = LRU if self.mode == POLICY else POLICY
            sw = Switch(time_s, self.mode, pol, lru)
            self.switches.append(sw)
            self._since_s = time_s
            return sw
        return None

"""The guard's switch rule, shared by the simulator's driver and the vLLM plugin.

Two shadow caches run on the sampled blocks (sampling.py), one in LRU order and one under the policy;
after each step (a slice of requests in the simulator, a request in the engine) the caller reports the
sampled references and each side's hits. The rule is a sequential test (a CUSUM, Page 1954) on the other
order's lead over the running one, x_i = its hits minus the running order's in step i (r_i references):

- the run: the steps since the running order last led, i.e. since sum x_i over the run last fell to <= 0
  (the run then restarts empty at that step's end), so a change is judged on the evidence after it, not
  diluted by the window before it;
- the evidence: the other order's mean lead over the run, D = sum x_i / sum r_i, in hit-ratio points,
  times the run's length in seconds; the switch needs
      D x run_s >= margin_points x window_s          (policy -> LRU)
      D x run_s >= BACK_FACTOR x margin_points x window_s   (LRU -> policy)
  i.e. a lead of `margin` points held for a full `window_s`, or a lead four times as large for a
  quarter of it: the loss accepted before a switch is bounded, and a large loss is cut early;
- and significance: D is at least Z_CRIT standard errors, the variance estimated from the run's steps as
  a ratio estimator's, var(D) = n/(n-1) sum_i (x_i - D r_i)^2 / (sum_i r_i)^2 (at least 2 steps).

Why not a fixed window with a margin: after a shift the window still holds the minutes before it, so the
switch waits for the window to turn over, and a short real lead of LRU (a few points for two minutes,
which an unshifted trace has) passes the same test as a lasting one. The evidence bar in point-seconds
weighs both size and duration. The way back is harder (BACK_FACTOR): a policy caught losing has shown
that its fit can be wrong here, a switch costs a refill of the cache in the other order, and a guard that
flips back on a short lead of the stale policy pays the next detection again (bench_guard.py, seed 1 at
0.125L: with the way back at twice the bar, the guard returned 45 minutes after the shift on a lead of
the stale policy and had to leave again 6 minutes later, -0.57 points over the hour against -0.28 with
four times). The cost of the bar: the loss accepted before a switch is about the bar itself, and a real
lead of LRU above it on an unshifted trace costs a round trip (docs/guard.md, "Measured"). The defaults,
margin 5 (600 point-seconds to leave) and BACK_FACTOR 4 (2,400 to return), were chosen on seeds 1 and 2
of bench_guard.py at full size and held on seeds 3 to 6.

The callers report steps through `observe_warm`, which counts a step only once the LRU shadow has
evicted (the caches are warm): while a cache fills, both orders hold everything and the difference is
noise. Every switch is kept with the two
sides' hit ratios over the run that decided it. `estimates()` gives both hit ratios over the last
`window_s` seconds (the operator's view; the rule uses the run).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

POLICY, LRU = "policy", "lru"
Z_CRIT = 2.0  # standard errors the run's lead must exceed
BACK_FACTOR = 4.0  # the evidence to return to the policy, in multiples of the evidence to leave it


@dataclass(frozen=True)
class GuardSettings:
    """The guard's and the refit's parameters, as WA's settings (tongyi_trace.policy.settings.WaSettings,
    which extends this type) name them, with their defaults and help; `check()` is their one validation
    (WaSettings and the vLLM plugin call it)."""

    guard: bool = field(default=True, metadata={
        "help": "shadow-LRU guard: switch to LRU order while a sampled LRU beats WA (tongyi_trace.policy.guard)"})
    guard_margin: float = field(default=5.0, metadata={
        "help": "guard: the lead, in hit-ratio points, that held for guard_window_s switches the order "
                "(margin x window point-seconds and two standard errors; four times that to return)"})
    guard_window_s: float = field(default=120.0, metadata={
        "help": "guard: seconds of that bar, and of the reported windowed hit ratios"})
    refit_s: float = field(default=0.0, metadata={
        "help": "online refit every this many trace seconds (0 = off)"})
    window_s: float = field(default=600.0, metadata={
        "help": "online refit: the sliding window of reuse samples, s"})
    sample_rate: float = field(default=1 / 32, metadata={
        "help": "guard and refit: share of blocks sampled by hash (SHARDS), in (0, 1]; the shadows hold at "
                "least 512 blocks"})

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
    """One switch of the guard: when, to which mode, and both sides' hit ratios over the run that
    decided it."""

    time_s: float
    to_mode: str
    policy_hit_ratio: float
    lru_hit_ratio: float


class Guard:
    """The switch rule (see the module doc)."""

    def __init__(self, margin_points: float, window_s: float) -> None:
        self.evidence_point_s = margin_points * window_s
        self.window_s = window_s
        self.mode = POLICY
        self.switches: list[Switch] = []
        self.time_in_mode_s = {POLICY: 0.0, LRU: 0.0}
        self._steps: deque[tuple[float, int, int, int]] = deque()  # (time_s, refs, policy hits, lru hits)
        self._sums = [0, 0, 0]  # refs, policy hits, lru hits over the window
        self._last_s: float | None = None
        self._run_start_s = 0.0
        self._run = [0, 0, 0, 0, 0, 0, 0]  # steps, refs, policy hits, lru hits, sums of x^2, x r, r^2 (exact ints)

    def estimates(self) -> tuple[float, float, int]:
        """(policy hit ratio, LRU hit ratio, sampled references) over the last window_s seconds."""
        refs, ph, lh = self._sums
        return (ph / refs, lh / refs, refs) if refs else (0.0, 0.0, 0)

    def run_lead(self) -> tuple[float, float, float]:
        """(D, its z score, the run's seconds so far): the other order's lead over the running one on the
        current run (see the module doc); z is 0 below 2 steps, +inf when the steps agree exactly."""
        n, refs, ph, lh, xx, xr, rr = self._run
        if refs == 0:
            return 0.0, 0.0, 0.0
        lead = lh - ph if self.mode == POLICY else ph - lh
        d, run_s = lead / refs, (self._last_s or 0.0) - self._run_start_s
        if n < 2:
            return d, 0.0, run_s
        ss = refs * refs * xx - 2 * lead * refs * xr + lead * lead * rr  # refs^2 sum (x_i - D r_i)^2, exact
        return d, (lead * refs / math.sqrt(ss * n / (n - 1)) if ss > 0 else math.copysign(math.inf, d)), run_s

    def _window_add(self, time_s: float, refs: int, policy_hits: int, lru_hits: int) -> None:
        self._steps.append((time_s, refs, policy_hits, lru_hits))
        s = self._sums
        self._sums = [s[0] + refs, s[1] + policy_hits, s[2] + lru_hits]
        while self._steps[0][0] <= time_s - self.window_s:
            _, r, p, q = self._steps.popleft()
            s = self._sums
            self._sums = [s[0] - r, s[1] - p, s[2] - q]

    def _restart_run(self, time_s: float) -> None:
        self._run = [0, 0, 0, 0, 0, 0, 0]
        self._run_start_s = time_s

    def observe_warm(self, time_s: float, refs: int, policy_hits: int, lru_hits: int,
                     lru_evictions: int) -> Switch | None:
        """`observe` once the caches are warm, i.e. the LRU shadow has evicted (LRU_EVICTIONS > 0, module
        doc); a step before that is ignored (None)."""
        if lru_evictions <= 0:
            return None
        return self.observe(time_s, refs, policy_hits, lru_hits)

    def observe(self, time_s: float, refs: int, policy_hits: int, lru_hits: int) -> Switch | None:
        """Report one step ending at TIME_S (sampled REFS and both sides' hits); the switch, if any."""
        if self._last_s is None:
            self._run_start_s = time_s
        else:
            self.time_in_mode_s[self.mode] += max(time_s - self._last_s, 0.0)
        self._last_s = time_s
        self._window_add(time_s, refs, policy_hits, lru_hits)
        x = lru_hits - policy_hits if self.mode == POLICY else policy_hits - lru_hits
        n, r, p, q, xx, xr, rr = self._run
        self._run = [n + 1, r + refs, p + policy_hits, q + lru_hits, xx + x * x, xr + x * refs, rr + refs * refs]
        if (q - p if self.mode == POLICY else p - q) + x <= 0:  # the running order leads: a new run
            self._restart_run(time_s)
            return None
        d, z, run_s = self.run_lead()
        need = self.evidence_point_s * (BACK_FACTOR if self.mode == LRU else 1.0)
        if 100.0 * d * run_s < need or z < Z_CRIT:
            return None
        _, refs_run, ph, lh = self._run[:4]
        self.mode = LRU if self.mode == POLICY else POLICY
        sw = Switch(time_s, self.mode, ph / refs_run, lh / refs_run)
        self.switches.append(sw)
        self._restart_run(time_s)
        return sw

"""One settings type per policy that both the simulator and the vLLM plugin run: the values, their
defaults, their help and their one validation. The simulator's parameter classes extend these with
their kernel arrays (sim/policies/wa.py, sim/policies/s3fifo.py); the plugin reads them as they are.

    WaSettings      WA's switches (paper section 4.2) and, inherited, the shadow-LRU guard's and the
                    online refit's settings (tongyi_trace.policy.guard.GuardSettings)
    S3FifoSettings  S3-FIFO's queue sizes and thresholds (SOSP'23, Algorithm 1)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tongyi_trace.errors import UsageError
from tongyi_trace.policy.guard import GuardSettings
from tongyi_trace.policy.wa_priority import MODELS


@dataclass(frozen=True)
class WaSettings(GuardSettings):
    """WA's switches, with the guard's and the refit's settings (the fitted per-category parameters come
    from the policy file)."""

    model: str = field(default="exp", metadata={"help": "reuse model: exp (fitted p, lambda) or km (Kaplan-Meier)"})
    conditional: bool = field(default=False, metadata={
        "help": "condition on no reuse by t (--wa-conditional)"})
    life_s: float = field(default=0.0, metadata={
        "help": "life window for every category, s (0 = each category's fitted life_s)"})
    use_life: bool = field(default=True, metadata={"help": "lifespan regulator (off: --wa-no-life)"})
    use_offset: bool = field(default=True, metadata={"help": "deeper block first on ties (off: --wa-no-offset)"})

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise UsageError(f"policy wa: parameter model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if not (self.life_s >= 0.0 and self.life_s < float("inf")):
            raise UsageError(f"policy wa: parameter life_s must be a finite number >= 0, got {self.life_s}")
        self.check()

    def guard_settings(self) -> GuardSettings:
        """The guard's and the refit's settings alone."""
        return GuardSettings(**{name: getattr(self, name) for name in GUARD_FIELDS})


GUARD_FIELDS = tuple(f.name for f in dataclasses.fields(GuardSettings))
# WA's own switches (what a fitted choice of `kvtrace fit --capacity` may set, with leaf_only)
WA_SWITCHES = tuple(f.name for f in dataclasses.fields(WaSettings) if f.name not in GUARD_FIELDS)


@dataclass(frozen=True)
class S3FifoSettings:
    """S3-FIFO's queue sizes and thresholds (SOSP'23, Algorithm 1: small FIFO 10%, ghost 90% of the cache,
    one hit in S moves a block to M, frequency capped at 3)."""

    small_ratio: float = field(default=0.10, metadata={"help": "small FIFO share of the capacity"})
    ghost_ratio: float = field(default=0.90, metadata={"help": "ghost entries as a share of the capacity"})
    move_to_main_threshold: int = field(default=1, metadata={
        "help": "hits while in S needed to move to M"})
    freq_cap: int = field(default=3, metadata={"help": "frequency counter saturates here"})

    def __post_init__(self) -> None:
        if not 0.0 < self.small_ratio < 1.0:
            raise UsageError(f"policy s3fifo: parameter small_ratio must be in (0, 1), got {self.small_ratio}")
        if not 0.0 <= self.ghost_ratio <= 10.0:
            raise UsageError(f"policy s3fifo: parameter ghost_ratio must be in [0, 10], got {self.ghost_ratio}")
        if self.move_to_main_threshold < 1 or self.freq_cap < 1:
            raise UsageError("policy s3fifo: parameters move_to_main_threshold and freq_cap must be >= 1")

    @classmethod
    def of(cls, params: dict[str, Any]) -> S3FifoSettings:
        """The settings a policy file's choice PARAMS name (other keys are not S3-FIFO's: ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in names})

"""What the plugin's free-block queue runs: the eviction mode, the categories' reuse models and the WA
switches, with the guard's settings (read from the server's environment by config.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from tongyi_trace.policy.file import CategoryParams
from tongyi_trace.policy.guard import GuardSettings
from tongyi_trace.policy.names import Policy
from tongyi_trace.policy.settings import WA_SWITCHES, S3FifoSettings


@dataclass(frozen=True)
class QueuePolicy:
    """What the queue needs to decide: the mode, the categories and the WA switches.

    `time_scale` converts the engine's wall seconds into the trace seconds the policy was fitted on
    (a replay at speed x runs x trace seconds per wall second). `life_s` > 0 replaces every category's
    life window; `leaf_only` None = on for WA, off otherwise."""

    mode: str
    categories: dict[str, CategoryParams]  # the policy file's reuse models (policy/file.py)
    default: CategoryParams
    use_life: bool = True
    conditional: bool = False
    use_offset: bool = True
    time_scale: float = 1.0
    model: str = "exp"
    life_s: float = 0.0
    leaf_only: bool | None = None
    # mode "fitted": (capacity_tokens, policy, params) chosen by `kvtrace fit --capacity`
    choices: tuple[tuple[int, str, dict[str, Any]], ...] = ()
    block_size: int = 16  # tokens per engine block (the plugin is told by KVTRACE_BLOCK_SIZE)
    guard: GuardSettings | None = None  # the shadow-LRU guard and the online refit (guard.py), WA only
    s3fifo: S3FifoSettings = field(default_factory=S3FifoSettings)  # mode s3fifo (a fitted choice may set them)

    @property
    def prefix_closed(self) -> bool:
        """Whether leaf_only applies."""
        return self.leaf_only if self.leaf_only is not None else self.mode == "wa"

    def for_pool(self, capacity_blocks: int) -> QueuePolicy:
        """The policy to run on a cache of CAPACITY_BLOCKS engine blocks: mode "fitted" takes the choice
        whose capacity in tokens is nearest (by ratio; WA with its defaults when there is none); any other
        mode is itself."""
        if self.mode != "fitted":
            return self
        if not self.choices:
            return replace(self, mode="wa")
        c = max(capacity_blocks * self.block_size, 1)
        _, mode, params = min(self.choices, key=lambda ch: (abs(math.log(max(ch[0], 1) / c)), ch[0]))
        known = {f for f in (*WA_SWITCHES, "leaf_only") if f in params}
        if mode == Policy.S3FIFO:
            return replace(self, mode=mode, s3fifo=S3FifoSettings.of(params),
                           **{k: params[k] for k in known & {"leaf_only"}})
        return replace(self, mode=mode, **{k: params[k] for k in known})

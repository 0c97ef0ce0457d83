"""The policy registry: one entry per policy file, keyed by the `Policy` enum (no string if-chains)."""

from __future__ import annotations

from enum import StrEnum

from tongyi_trace.errors import UsageError
from tongyi_trace.sim.policies import fifo, gdsf, lfu, lru, oracle, s3fifo, wa
from tongyi_trace.sim.policy_base import PolicySpec


class Policy(StrEnum):
    """The simulated eviction policies."""

    LRU = "lru"
    FIFO = "fifo"
    LFU = "lfu"
    S3FIFO = "s3fifo"
    GDSF = "gdsf"
    WA = "wa"
    ORACLE = "oracle"


REGISTRY: dict[Policy, PolicySpec] = {
    Policy.LRU: lru.SPEC,
    Policy.FIFO: fifo.SPEC,
    Policy.LFU: lfu.SPEC,
    Policy.S3FIFO: s3fifo.SPEC,
    Policy.GDSF: gdsf.SPEC,
    Policy.WA: wa.SPEC,
    Policy.ORACLE: oracle.SPEC,
}

BASELINES = (Policy.LRU, Policy.FIFO, Policy.LFU, Policy.S3FIFO, Policy.GDSF)


def get_policy(name: str | Policy) -> PolicySpec:
    """The spec of policy NAME (case-insensitive), or UsageError listing the known ones."""
    try:
        return REGISTRY[Policy(str(getattr(name, "value", name)).lower())]
    except ValueError:
        raise UsageError(f"unknown policy {name!r}; choose from {', '.join(p.value for p in Policy)}") from None


def parse_policies(text: str) -> list[Policy]:
    """'lru,fifo' or 'all' -> the policies, in order, without duplicates."""
    if text.strip().lower() == "all":
        return list(Policy)
    out: list[Policy] = []
    for part in text.split(","):
        part = part.strip()
        if part:
            pol = Policy(get_policy(part).name)
            if pol not in out:
                out.append(pol)
    if not out:
        raise UsageError("--policy is empty; give e.g. lru,fifo,wa")
    return out

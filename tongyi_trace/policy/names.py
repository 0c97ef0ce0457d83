"""The one enum of policy names and the eviction modes of the vLLM plugin, read by the simulator's
registry, the fit, the policy file, the plugin and the engine's command line.

    Policy           the simulated eviction policies (sim/policies/, one file each)
    PLUGIN_POLICIES  what the vLLM plugin can run, and so what a policy file's choice may name
    PLUGIN_BASELINES the plugin's baselines: what `kvtrace fit --capacity` weighs against WA
    FITTED           the mode that runs the policy file's choice for the cache size
    EVICTION_MODES   KVTRACE_EVICTION's values: the plugin's policies and FITTED
"""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    """The simulated eviction policies."""

    LRU = "lru"
    FIFO = "fifo"
    LFU = "lfu"
    S3FIFO = "s3fifo"
    GDSF = "gdsf"
    WA = "wa"
    ORACLE = "oracle"


FITTED = "fitted"
PLUGIN_BASELINES: tuple[str, ...] = (Policy.LRU.value, Policy.FIFO.value, Policy.S3FIFO.value)
PLUGIN_POLICIES: tuple[str, ...] = (Policy.WA.value, *PLUGIN_BASELINES)
EVICTION_MODES: tuple[str, ...] = (*PLUGIN_POLICIES, FITTED)

"""The policy registry: one entry per policy file, keyed by the `Policy` enum of policy/names.py (no
string if-chains), and what reports and the CLI show of the policies (names, baselines, colours, the paper's figure).

The names and colours load without the policies (no numba): REGISTRY and get_policy import them on first
use."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from tongyi_trace.errors import UsageError
from tongyi_trace.policy.names import FITTED, Policy

if TYPE_CHECKING:
    from tongyi_trace.sim.policy_base import PolicySpec


BASELINES = (Policy.LRU, Policy.FIFO, Policy.LFU, Policy.S3FIFO, Policy.GDSF)
# `kvtrace simulate`'s default: the baselines and the oracle (no policy file needed)
DEFAULT_POLICIES = ",".join([*BASELINES, Policy.ORACLE])
DEFAULT_CAPACITIES = "1%,5%,10%,25%,50%,inf"  # and its capacities (the API's Run.simulate too)
# `kvtrace simulate`'s WA ablation variants: name -> WA's parameters; FITTED: the setting `kvtrace fit
# --capacity` chose, per capacity (the policy file's nearest choice, sim.simulate.resolve_fitted)
WA_ABLATION: dict[str, dict[str, bool]] = {
    "wa-no-life": {"use_life": False},
    "wa-conditional": {"conditional": True},
    "wa-no-offset": {"use_offset": False},
    "wa-no-guard": {"guard": False},  # the bare policy: what the shadow-LRU guard (on by default) adds
}
# the oracle's variants: bounds that know less of the future (policies/oracle.py)
ORACLE_VARIANTS: dict[str, dict[str, str]] = {"oracle-dead": {"knows": "dead"}}
# every variant `kvtrace simulate` runs under its own name: name -> (its policy, the parameters it sets)
VARIANTS: dict[str, tuple[Policy, dict[str, Any]]] = {
    **{name: (Policy.WA, over) for name, over in WA_ABLATION.items()},
    **{name: (Policy.ORACLE, over) for name, over in ORACLE_VARIANTS.items()}}
# WA's gain over the best baseline the paper reports (hit-ratio points, smallest to largest capacity):
# Wang et al., "KVCache Cache in the Wild", USENIX ATC'25, section 5
PAPER_WA_GAIN_POINTS = (1.5, 3.9)
# the colour of each policy and variant in figures
COLORS: dict[str, str] = {
    Policy.LRU: "#1f77b4", Policy.FIFO: "#ff7f0e", Policy.LFU: "#8c564b", Policy.S3FIFO: "#9467bd",
    Policy.GDSF: "#e377c2", Policy.WA: "#d62728", Policy.ORACLE: "#2ca02c",
    "wa-no-life": "#ff9896", "wa-conditional": "#c5b0d5", "wa-no-offset": "#f7b6d2", "wa-no-guard": "#bcbd22",
    FITTED: "#000000",
    "oracle-dead": "#98df8a"}
OTHER_COLOR = "#7f7f7f"  # any other name


@cache
def _registry() -> dict[Policy, PolicySpec]:
    from tongyi_trace.sim.policies import fifo, gdsf, lfu, lru, oracle, s3fifo, wa

    return {Policy.LRU: lru.SPEC, Policy.FIFO: fifo.SPEC, Policy.LFU: lfu.SPEC, Policy.S3FIFO: s3fifo.SPEC,
            Policy.GDSF: gdsf.SPEC, Policy.WA: wa.SPEC, Policy.ORACLE: oracle.SPEC}


REGISTRY: dict[Policy, PolicySpec]


def __getattr__(name: str) -> object:
    if name == "REGISTRY":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_policy(name: str | Policy) -> PolicySpec:
    """The spec of policy NAME (case-insensitive), or UsageError listing the known ones."""
    try:
        pol = Policy(str(getattr(name, "value", name)).lower())
    except ValueError:
        raise UsageError(f"unknown policy {name!r}; choose from {', '.join(p.value for p in Policy)}") from None
    return _registry()[pol]


def parse_policies(text: str) -> list[str]:
    """`--policies`: 'lru,fitted,oracle-dead' (an item 'all': every policy) -> the names, in order, without
    duplicates: policies, FITTED and the VARIANTS; an unknown name or an empty list is a UsageError."""
    out: list[str] = []
    for part in text.split(","):
        low = part.strip().lower()
        if not low:
            continue
        if low == "all":
            names = [p.value for p in Policy]
        elif low in (FITTED, *VARIANTS):
            names = [low]
        else:
            try:
                names = [Policy(low).value]
            except ValueError:
                raise UsageError(f"unknown policy {part.strip()!r}; choose from "
                                 f"{', '.join([*Policy, FITTED, *VARIANTS])} (or all)") from None
        out += [n for n in names if n not in out]
    if not out:
        raise UsageError("--policy is empty; give e.g. lru,fifo,wa")
    return out

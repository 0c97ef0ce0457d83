"""What every policy file declares: its typed parameter set and state needs (the registry in
`registry.py` collects them). The compiled hooks of a policy all share one signature:

    access(st, x, kp)                                 a cached block is used by the current request
    insert(st, x, kp)                                 a missing block enters the cache (pinned)
    release(st, x, ref, pos, num_tokens, cat, now_s, kp)   the request is served: unpin x (called
                                                      deepest block first, so the head is most recent)
    evict(st, now_s, kp) -> victim id or -1           choose an unpinned cached block to drop
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tongyi_trace.errors import UsageError


@dataclass(frozen=True)
class NoParams:
    """This policy has no parameters."""

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) arrays for the kernel."""
        return np.zeros(8, np.int64), np.zeros(8, np.float64)


@dataclass(frozen=True)
class PolicySpec:
    """One policy: name, parameter class and what state it needs.

    Every policy also takes the kernel's `leaf_only` switch (prefix closure, kernel.py) as a parameter;
    `leaf_only_default` is its default for this policy."""

    name: str
    params_cls: type
    summary: str
    uses_heap: bool = False
    queues_per_category: bool = False
    queues_per_count: bool = False  # one queue per reference count (LFU buckets)
    num_queues: int = 1
    needs_next_use: bool = False
    needs_fit: bool = False
    leaf_only_default: bool = False
    hooks: Any = None  # the policy module (its compiled access/insert/release/evict)

    def make_params(self, values: dict[str, Any] | None = None) -> tuple[Any, bool]:
        """(typed parameters, leaf_only) from VALUES (str or typed), defaults for the rest; unknown keys
        are errors."""
        values = dict(values or {})
        leaf_only = self.leaf_only_default
        if "leaf_only" in values:
            leaf_only = _coerce(self.name, "leaf_only", "bool", values.pop("leaf_only"))
        fields = {f.name: f for f in dataclasses.fields(self.params_cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            known = ", ".join([*fields, "leaf_only"])
            raise UsageError(f"policy {self.name}: unknown parameter(s) {', '.join(unknown)}; "
                             f"known: {known}")
        typed: dict[str, Any] = {}
        for k, v in values.items():
            typed[k] = _coerce(self.name, k, fields[k].type, v)
        return self.params_cls(**typed), leaf_only

    def describe(self) -> list[dict[str, Any]]:
        """Each parameter: name, type, default, help (from the dataclass field metadata)."""
        out = []
        for f in dataclasses.fields(self.params_cls):
            out.append({"name": f.name, "type": str(f.type), "default": f.default,
                        "help": f.metadata.get("help", "")})
        out.append({"name": "leaf_only", "type": "bool", "default": self.leaf_only_default,
                    "help": "prefix closure: never evict a block that has cached children"})
        return out


def _coerce(policy: str, key: str, typ: Any, v: Any) -> Any:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t == "bool":
            if isinstance(v, bool):
                return v
            s = str(v).lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(v)
        if t == "int":
            return int(v)
        if t == "float":
            f = float(v)
            if not math.isfinite(f):
                raise ValueError(v)
            return f
    except (TypeError, ValueError):
        raise UsageError(f"policy {policy}: parameter {key} must be {t}, got {v!r}") from None
    return v

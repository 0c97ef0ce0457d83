"""What every policy file declares (the registry in `registry.py` collects them), the way a libCacheSim
policy owns its params struct:

    SPEC    PolicySpec: name, typed parameter class, summary, the module itself as `hooks`
    STATE   StateDecl: the per-block columns and scalars it keeps in the simulator state, each with its
            meaning (structs.py has the arrays; the kernel knows none of a policy's fields)
    init(params, ctx) -> Setup   (plain Python, once per cache) its parameter arrays ip/fp laid out for
            its hooks, its queues, heap size, initial scalars and tables for this capacity and stream
    PREFIX_CLOSED  (optional, default False) True when the policy never evicts a block before its
            cached children, whatever the stream: the kernel then skips counting them (kernel.py)
    keeps(..., x) -> bool  (optional, compiled; default hooks.keeps_none) whether the block X, evicted,
            is still read by the policy when it comes back (S3-FIFO's ghost): a state per slot keeps
            its slot while it is (structs.py); at most Setup.num_retained blocks at once

and the compiled hooks (numba, inlined into the kernel's loop, kernel.policy_kernel), which share one
argument list: the state arrays (bk, hp, g, gf, qs), the policy's ip, fp, its float table ft and its
integer table it (Setup), then

    access(..., x)                                    a cached block is used by the current request
    insert(..., x)                                    a missing block enters the cache (pinned)
    release(..., x, ref, pos, num_tokens, cat, now_s) the request is served: unpin x (called deepest
                                                      block first, so the head is most recent)
    evict(..., now_s) -> victim id or -1              choose an unpinned cached block to drop

A hook that several policies share (do nothing; leave the queue while used) is bound from sim/hooks.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.sim.structs import G_POLICY, MAX_HEAP_IDS, MAX_HEAP_PUSHES, POLICY_COL0, POLICY_COLUMNS

if TYPE_CHECKING:
    from tongyi_trace.policy.file import PolicyParams
    from tongyi_trace.sim.stream import Stream

NUM_PARAMS = 8  # ip and fp slots


@dataclass(frozen=True)
class StateDecl:
    """A policy's share of the simulator state, each name with its meaning: per-block int64 COLUMNS of bk
    (at most structs.POLICY_COLUMNS), int64 scalars SLOTS of g and float64 scalars FSLOTS of gf. A name
    whose meaning says "per queue" is the first of one slot per queue (declare it last)."""

    columns: dict[str, str] = field(default_factory=dict)
    slots: dict[str, str] = field(default_factory=dict)
    fslots: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.columns) > POLICY_COLUMNS:
            raise ValueError(f"a policy may declare at most {POLICY_COLUMNS} columns, got {list(self.columns)}")

    def col(self, name: str) -> int:
        """The bk column of NAME."""
        return POLICY_COL0 + list(self.columns).index(name)

    def slot(self, name: str) -> int:
        """The g index of NAME."""
        return G_POLICY + list(self.slots).index(name)

    def fslot(self, name: str) -> int:
        """The gf index of NAME."""
        return list(self.fslots).index(name)


@dataclass(frozen=True)
class InitContext:
    """What a policy's init hook may size and fill its state from: one cache of CAPACITY_BLOCKS blocks over
    STREAM, with the policy file FIT and precomputed next uses NEXT_REQ when the caller has them."""

    stream: Stream
    capacity_blocks: int
    fit: PolicyParams | None = None
    next_req: np.ndarray | None = None

    @property
    def max_cached(self) -> int:
        """The most blocks the cache can hold at once."""
        return min(self.capacity_blocks, self.stream.num_ids)

    @property
    def lazy_heap_entries(self) -> int:
        """Heap entries for a lazy heap (structs.heap_push) over this cache: the cached blocks, the longest
        request, and as many stale entries between compactions."""
        s = self.stream
        if s.num_refs > MAX_HEAP_PUSHES or s.num_ids > MAX_HEAP_IDS:
            raise UsageError(f"the simulator's heap takes at most {MAX_HEAP_PUSHES:,} references and "
                             f"{MAX_HEAP_IDS:,} distinct blocks; this stream has {s.num_refs:,} and {s.num_ids:,}: "
                             "simulate a shorter window of the trace")
        max_req = int(np.diff(s.req_off).max()) if s.num_requests else 0
        return 2 * self.max_cached + 2 * max_req + 64


@dataclass
class Setup:
    """What a policy's init hook gives one cache: IP, FP (NUM_PARAMS int64 and float64 parameters in the
    policy's layout), FT (a float64 2-D table) and IT (an int64 1-D table) its hooks read, NUM_QUEUES
    queues, a heap of HEAP_SIZE entries (0 = none), the initial values of its scalars in the order
    of its StateDecl (G0 for g, GF0 for gf), and NUM_RETAINED: at most how many evicted blocks it keeps
    (`keeps`: S3-FIFO's ghost), what a state per slot holds beyond the cache (structs.slots_for)."""

    ip: np.ndarray
    fp: np.ndarray
    ft: np.ndarray = field(default_factory=lambda: np.zeros((1, 1), np.float64))
    it: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    num_queues: int = 1
    heap_size: int = 0
    g0: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gf0: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    num_retained: int = 0


@dataclass(frozen=True)
class NoParams:
    """This policy has no parameters."""

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ip, fp) arrays for the kernel."""
        return np.zeros(NUM_PARAMS, np.int64), np.zeros(NUM_PARAMS, np.float64)


@dataclass(frozen=True)
class PolicySpec:
    """One policy: name, parameter class, summary, its module (hooks).

    Every policy also takes the kernel's `leaf_only` switch (prefix closure, kernel.py) as a parameter;
    `leaf_only_default` is its default for this policy."""

    name: str
    params_cls: type
    summary: str
    needs_fit: bool = False
    leaf_only_default: bool = False
    hooks: Any = None  # the policy module (STATE, init and its compiled access/insert/release/evict)

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

    def retained_blocks(self, values: dict[str, Any] | None, capacity_blocks: int) -> int:
        """The most evicted blocks this policy with parameters VALUES keeps at once at CAPACITY_BLOCKS (its
        module's `retained`, else none): what a state per slot holds beyond the cache (Setup.num_retained)."""
        retained = getattr(self.hooks, "retained", None)
        return 0 if retained is None else int(retained(self.make_params(values)[0], capacity_blocks))

    def describe(self) -> list[dict[str, Any]]:
        """Each parameter: name, type, default, help (from the dataclass field metadata); a policy's own
        parameters first, then those its settings inherit (WA's switches, then the guard's)."""
        mro = self.params_cls.__mro__

        def depth(f: dataclasses.Field[Any]) -> int:
            return next(i for i, c in enumerate(mro) if f.name in getattr(c, "__annotations__", {}))

        out = []
        for f in sorted(dataclasses.fields(self.params_cls), key=depth):
            out.append({"name": f.name, "type": str(f.type), "default": f.default,
                        "help": f.metadata.get("help", "")})
        out.append({"name": "leaf_only", "type": "bool", "default": self.leaf_only_default,
                    "help": "prefix closure: never evict a block that has cached children"})
        return out


def prefix_closed(hooks: Any) -> bool:
    """The policy module HOOKS' PREFIX_CLOSED claim (module doc; False when it makes none)."""
    return bool(getattr(hooks, "PREFIX_CLOSED", False))


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

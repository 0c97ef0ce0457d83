"""What a router sees when a request arrives, and the interface every router implements.

A router picks the instance of request r at r's arrival, from what a real router has then: each
instance's outstanding prefill work and requests routed so far (`FleetView`), the request's
conversation (session), the prefix index the router keeps of what it routed (SGLang's approximate
radix tree, here an LRU index of each instance's size) and, for routers fed by the engines' KV events
(Dynamo, llm-d precise mode), each instance's real cached prefix of r."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class FleetView(Protocol):
    """The fleet as a router sees it at the arrival of a request (fleet/simulate.py implements it)."""

    num_instances: int
    s_per_token: float  # prefill seconds per uncached token (the cost model's b)

    def outstanding_s(self, r: int) -> np.ndarray:
        """float64[num_instances]: queued prefill work not yet done when request R arrives (seconds)."""
        ...

    def num_routed(self) -> np.ndarray:
        """int64[num_instances]: requests routed to each instance so far."""
        ...

    def session(self, r: int) -> int:
        """The conversation of request R (the first block's id when the trace has no conversations)."""
        ...

    def indexed_prefix(self, r: int) -> np.ndarray:
        """int64[num_instances]: leading blocks of R in the router's own index of what it routed."""
        ...

    def cached_prefix(self, r: int) -> np.ndarray:
        """int64[num_instances]: leading blocks of R cached on each instance now (KV events)."""
        ...

    def uncached_tokens(self, r: int, cached_blocks: np.ndarray) -> np.ndarray:
        """int64[num_instances]: R's prompt tokens beyond CACHED_BLOCKS leading blocks per instance."""
        ...


class Router(Protocol):
    """Chooses an instance per request; may keep state between requests (one object per simulation)."""

    name: str
    uses_index: bool  # reads view.indexed_prefix (the simulator then keeps the index)

    def choose(self, r: int, view: FleetView) -> int:
        """The instance that serves request R."""
        ...


def least_loaded_of(view: FleetView, r: int, among: list[int] | None = None) -> int:
    """The instance with the least outstanding work at R's arrival (of AMONG, default all); ties go to
    the one with the fewest requests routed so far, then the lowest index."""
    if among is not None and len(among) == 1:
        return among[0]
    work = view.outstanding_s(r).tolist()
    routed = view.num_routed().tolist()
    cand = range(view.num_instances) if among is None else among
    return min(cand, key=lambda i: (work[i], routed[i], i))


def best_of(values: np.ndarray, *, largest: bool) -> list[int]:
    """The indices of the largest (or smallest) of VALUES, in order."""
    v = values.tolist()
    m = max(v) if largest else min(v)
    return [i for i, x in enumerate(v) if x == m]


def check_params(router: str, given: dict[str, Any], known: dict[str, type]) -> dict[str, Any]:
    """GIVEN (strings from the command line) typed by KNOWN; an unknown key or a bad value is a UsageError."""
    from tongyi_trace.errors import UsageError

    out: dict[str, Any] = {}
    for key, value in given.items():
        if key not in known:
            names = ", ".join(known) or "none"
            raise UsageError(f"router {router} has no parameter {key!r} (parameters: {names})")
        try:
            out[key] = known[key](value)
        except ValueError:
            raise UsageError(f"router {router} parameter {key}={value!r} is not a {known[key].__name__}") from None
        if isinstance(out[key], float) and not (out[key] >= 0 and np.isfinite(out[key])):
            raise UsageError(f"router {router} parameter {key} must be a finite number >= 0, got {value}")
    return out

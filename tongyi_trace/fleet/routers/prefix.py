"""Prefix-aware (SGLang's cache-aware router, llm-d's approximate prefix scorer): the instance whose
entry in the router's own index of routed prompts holds the longest prefix of the request; ties (and no
match) go to the least loaded. The index is what the router routed, aged out LRU at each instance's
size: it does not see the instances' evictions (fleet/simulate.py keeps it)."""

from __future__ import annotations

from typing import Any

from tongyi_trace.fleet.routers.base import FleetView, best_of, check_params, least_loaded_of


class PrefixAware:
    """Longest indexed prefix, then least loaded."""

    name = "prefix"
    uses_index = True

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        check_params(self.name, params or {}, {})

    def choose(self, r: int, view: FleetView) -> int:
        """The instance with the longest indexed prefix of R."""
        h = view.indexed_prefix(r)
        return least_loaded_of(view, r, best_of(h, largest=True))

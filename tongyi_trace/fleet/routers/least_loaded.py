"""Least loaded: the instance with the least outstanding prefill work at arrival (ties: fewest requests
routed so far, then the lowest index), blind to what is cached."""

from __future__ import annotations

from typing import Any

from tongyi_trace.fleet.routers.base import FleetView, check_params, least_loaded_of


class LeastLoaded:
    """Shortest queue by outstanding work."""

    name = "least-loaded"
    uses_index = False

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        check_params(self.name, params or {}, {})

    def choose(self, r: int, view: FleetView) -> int:
        """The least loaded instance."""
        return least_loaded_of(view, r)

"""Oracle affinity (a bound, not a deployable router): the instance whose cache, as it is now, gives this
request the most hit blocks; ties go to the least loaded. With unlimited caches every request then hits
its ideal (the longest prefix any earlier request shares), so no router hits more; with finite caches it
is the per-request best, which a router that plans ahead can beat on some traces (docs/fleet.md)."""

from __future__ import annotations

from typing import Any

from tongyi_trace.fleet.routers.base import FleetView, best_of, check_params, least_loaded_of


class OracleAffinity:
    """Most cached blocks of this request now."""

    name = "oracle-affinity"
    uses_index = False

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        check_params(self.name, params or {}, {})

    def choose(self, r: int, view: FleetView) -> int:
        """The instance with the longest cached prefix of R."""
        h = view.cached_prefix(r)
        return least_loaded_of(view, r, best_of(h, largest=True))

"""Round robin: request k goes to instance k mod N, whatever it holds."""

from __future__ import annotations

from typing import Any

from tongyi_trace.fleet.routers.base import FleetView, check_params


class RoundRobin:
    """Cycles through the instances in order."""

    name = "rr"
    uses_index = False

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        check_params(self.name, params or {}, {})
        self.next = 0

    def choose(self, r: int, view: FleetView) -> int:
        """The next instance in turn."""
        i = self.next % view.num_instances
        self.next += 1
        return i

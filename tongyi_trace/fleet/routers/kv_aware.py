"""KV-aware (NVIDIA Dynamo's KV router, llm-d's scorer): fed by the instances' KV-cache events, it knows
each instance's cached prefix of the request and picks the least
    cost_i = WEIGHT x b x uncached prompt tokens on i + outstanding prefill work on i   (seconds)
(b = the cost model's prefill seconds per token; WEIGHT = 1 minimizes the request's own finish time,
larger values favour cache affinity over load); ties go to the least loaded."""

from __future__ import annotations

from typing import Any

from tongyi_trace.fleet.routers.base import FleetView, best_of, check_params, least_loaded_of


class KvAware:
    """Least weighted prefill + queue cost."""

    name = "kv-aware"
    uses_index = False

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        p = check_params(self.name, params or {}, {"weight": float})
        self.weight = float(p.get("weight", 1.0))

    def choose(self, r: int, view: FleetView) -> int:
        """The instance of least cost."""
        unc = view.uncached_tokens(r, view.cached_prefix(r))
        cost = self.weight * view.s_per_token * unc + view.outstanding_s(r)
        return least_loaded_of(view, r, best_of(cost, largest=False))

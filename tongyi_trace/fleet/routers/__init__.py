"""The routers of the fleet simulator (one per file) and their registry: `get_router("kv-aware:weight=2")`."""

from __future__ import annotations

from typing import Any

from tongyi_trace.errors import UsageError
from tongyi_trace.fleet.routers.base import FleetView, Router
from tongyi_trace.fleet.routers.kv_aware import KvAware
from tongyi_trace.fleet.routers.least_loaded import LeastLoaded
from tongyi_trace.fleet.routers.oracle_affinity import OracleAffinity
from tongyi_trace.fleet.routers.prefix import PrefixAware
from tongyi_trace.fleet.routers.rr import RoundRobin
from tongyi_trace.fleet.routers.session import SessionAffinity

ROUTERS: dict[str, Any] = {c.name: c for c in (RoundRobin, LeastLoaded, SessionAffinity, PrefixAware, KvAware,
                                               OracleAffinity)}

__all__ = ["ROUTERS", "FleetView", "Router", "get_router", "parse_routers"]


def get_router(spec: str) -> Router:
    """A fresh router from 'NAME' or 'NAME:KEY=VALUE[:KEY=VALUE]' (e.g. kv-aware:weight=2)."""
    name, *items = spec.strip().lower().split(":")
    if name not in ROUTERS:
        raise UsageError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)} (or all)")
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"router {spec!r}: write NAME:KEY=VALUE, e.g. kv-aware:weight=2")
        params[key] = value
    router: Router = ROUTERS[name](params)
    return router


def parse_routers(text: str) -> list[str]:
    """'rr,prefix' or 'all' -> the router specs, validated, in order, without duplicates."""
    items = list(ROUTERS) if text.strip().lower() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError("--router is empty; give e.g. rr,session,prefix,kv-aware (or all)")
    out: list[str] = []
    for item in items:
        get_router(item)
        if item not in out:
            out.append(item)
    return out

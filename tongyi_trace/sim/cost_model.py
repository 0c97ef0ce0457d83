"""QTTFT (time to first token including queueing) of one serving instance, from simulated hits.

Model: one instance serves prefills one at a time in arrival order (a FIFO queue; decode is ignored:
it overlaps with later prefills in a continuous-batching engine). Request i arriving at a_i with
u_i uncached prompt tokens and l_i tokens loaded from the CPU tier takes
    prefill_i = a + b x u_i + c x l_i
    start_i = max(a_i x arrival_scale, finish_{i-1}),  finish_i = start_i + prefill_i
    QTTFT_i = finish_i - a_i x arrival_scale
The CPU tier exists only with --hbm-capacity H < C: the exact two-tier cache (sim/simulate.py,
TieredCache) gives u_i and l_i, its DRAM hits (docs/fleet.md "Tiers").

Presets (A800-80GB, bf16, the paper's models): b = 2 x params / (peak FLOP/s x TP x MFU) with 312 TFLOP/s
and MFU 0.5; a = 15 ms (scheduling, sampling, one decode step); c = KV bytes per token / (PCIe 25 GB/s
x TP), no overlap (layer-wise async swap would hide part of it). Every value can be overridden, and
`calibrate_from_replay` takes a, b from the cost model a replay exported (cost_model.json, fitted to a
real engine by tongyi_trace.replay.cost); the simulator reads nothing else of replay's.

Saturation: the queue's utilization is rho = total prefill time / arrival span (first to last arrival,
scaled). With rho >= 1 one instance cannot keep up: the backlog, hence QTTFT, grows with the trace's
length instead of settling. floor(rho) + 1 instances (requests spread evenly) bring each below 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from numba import njit

from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.models import ModelPreset, get_preset

GPU_FLOPS = 312e12
MFU = 0.5
PCIE_BYTES_PER_S = 25e9


@dataclass(frozen=True)
class CostModel:
    """Prefill cost of one instance: a + b x uncached tokens + c x CPU-loaded tokens."""

    name: str
    overhead_s: float  # a
    s_per_token: float  # b
    s_per_loaded_token: float  # c
    arrival_scale: float = 1.0  # multiply the trace's arrival times (>1 = slower, lighter load)


def preset_cost(model: str | ModelPreset) -> CostModel:
    """The cost model of a model preset or its name (see the module doc for the derivation)."""
    m = get_preset(model) if isinstance(model, str) else model
    b = 2.0 * m.num_params / (GPU_FLOPS * m.tp * MFU)
    c = m.kv_bytes_per_token / (PCIE_BYTES_PER_S * m.tp)
    return CostModel(m.name, 0.015, b, c)


_OPTIONS = {"overhead_s": "--prefill-overhead-s", "s_per_token": "--prefill-s-per-token",
            "s_per_loaded_token": "--load-s-per-token", "arrival_scale": "--arrival-scale"}  # simulate's


def override(model: CostModel, *, overhead_s: float | None = None, s_per_token: float | None = None,
             s_per_loaded_token: float | None = None, arrival_scale: float | None = None) -> CostModel:
    """MODEL with the given values replaced."""
    changes: dict[str, float] = {k: v for k, v in {"overhead_s": overhead_s, "s_per_token": s_per_token,
                                 "s_per_loaded_token": s_per_loaded_token,
                                 "arrival_scale": arrival_scale}.items() if v is not None}
    for k, v in changes.items():
        strict = k == "arrival_scale"  # a scale of 0 would put every arrival at t = 0
        if not ((v > 0 if strict else v >= 0) and math.isfinite(v)):
            raise UsageError(f"{_OPTIONS[k]} must be a finite number {'>' if strict else '>='} 0 "
                             f"(the cost model's {k}), got {v}")
    return replace(model, **changes)  # type: ignore[arg-type]


@njit(cache=True)
def _fifo(arrival_s: np.ndarray, service_s: np.ndarray) -> np.ndarray:
    out = np.empty(arrival_s.shape[0])
    free_at = -np.inf
    for i in range(arrival_s.shape[0]):
        start = max(arrival_s[i], free_at)
        free_at = start + service_s[i]
        out[i] = free_at - arrival_s[i]
    return out


def service_s(model: CostModel, uncached_tokens: np.ndarray, loaded_tokens: np.ndarray | None = None) -> np.ndarray:
    """Prefill time of each request (seconds) under MODEL: a + b x uncached + c x loaded tokens."""
    service = model.overhead_s + model.s_per_token * uncached_tokens.astype(np.float64)
    if loaded_tokens is not None:
        service = service + model.s_per_loaded_token * loaded_tokens.astype(np.float64)
    return service


def qttft_s(model: CostModel, arrival_s: np.ndarray, uncached_tokens: np.ndarray,
            loaded_tokens: np.ndarray | None = None) -> np.ndarray:
    """QTTFT of each request (seconds) under MODEL."""
    service = service_s(model, uncached_tokens, loaded_tokens)
    return _fifo(np.asarray(arrival_s, np.float64) * model.arrival_scale, service)


def utilization(model: CostModel, arrival_s: np.ndarray, service: np.ndarray) -> float:
    """The single-instance queue's utilization: total service time / arrival span (inf for a zero span)."""
    if service.size == 0:
        return 0.0
    arr = np.asarray(arrival_s, np.float64) * model.arrival_scale
    span = float(arr.max() - arr.min())
    total = float(service.sum())
    return total / span if span > 0 else math.inf


def instances_needed(rho: float) -> int | None:
    """Fewest instances that keep each one's utilization below 1 (floor(rho) + 1; None when rho is inf)."""
    return math.floor(rho) + 1 if math.isfinite(rho) else None


def queue_summary(model: CostModel, arrival_s: np.ndarray, uncached_tokens: np.ndarray,
                  loaded_tokens: np.ndarray | None = None) -> dict[str, float | int | bool | None]:
    """QTTFT mean/P50/P99 plus utilization, saturated (utilization >= 1) and instances needed."""
    service = service_s(model, uncached_tokens, loaded_tokens)
    q = _fifo(np.asarray(arrival_s, np.float64) * model.arrival_scale, service)
    rho = utilization(model, arrival_s, service)
    return {**summarize_qttft(q), "utilization": rho if math.isfinite(rho) else None,
            "saturated": rho >= 1.0, "instances_needed": instances_needed(rho)}


def summarize_qttft(q: np.ndarray) -> dict[str, float]:
    """Mean, P50 and P99 of QTTFT values (seconds)."""
    if q.size == 0:
        return {"qttft_mean_s": 0.0, "qttft_p50_s": 0.0, "qttft_p99_s": 0.0}
    return {"qttft_mean_s": float(q.mean()), "qttft_p50_s": float(np.percentile(q, 50)),
            "qttft_p99_s": float(np.percentile(q, 99))}


def cost_artifact_path(path: Path) -> Path:
    """The cost-model artifact PATH names: the JSON file itself, a replay folder's cost_model.json, or a run
    folder's replay/cost_model.json (the most recent replay's)."""
    p = Path(path)
    for candidate in (p, p / "cost_model.json", p / "replay" / "cost_model.json"):
        if candidate.is_file():
            return candidate
    raise InputError(f"{p}: no cost model here (no cost_model.json, no replay/cost_model.json); run "
                     "'kvtrace replay' on this run first (it exports the fit after >= 3 completed requests)")


def calibrate_from_replay(path: Path, base: CostModel) -> CostModel:
    """BASE with a, b from replay's exported cost model (schema tongyi_trace.schemas.COST_SCHEMA, fitted by
    tongyi_trace.replay.cost: ttft_s = a_s + b_s_per_token x uncached tokens, a_s, b_s_per_token >= 0).
    PATH: the artifact, a replay folder or a run folder (see cost_artifact_path). Nothing else of replay's
    is read."""
    from tongyi_trace.run import read_artifact
    from tongyi_trace.schemas import COST_SCHEMA

    fitted = cost_artifact_path(path)
    doc = read_artifact(fitted, COST_SCHEMA) or {}  # refuses another schema or another run's cost model
    try:
        a, b = float(doc["a_s"]), float(doc["b_s_per_token"])
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{fitted}: field a_s/b_s_per_token unreadable ({e}); re-run 'kvtrace replay'") from e
    if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0):
        raise InputError(f"{fitted}: field a_s/b_s_per_token must be finite numbers >= 0, found {a}, {b}; "
                         "re-run 'kvtrace replay'")
    return replace(base, name=f"{base.name}+replay", overhead_s=a, s_per_token=b)

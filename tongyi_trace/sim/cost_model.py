"""QTTFT (time to first token including queueing) of one serving instance, from simulated hits.

Model: one instance serves prefills one at a time in arrival order (a FIFO queue; decode is ignored:
it overlaps with later prefills in a continuous-batching engine). Request i arriving at a_i with
u_i uncached prompt tokens and l_i tokens loaded from the CPU tier takes
    prefill_i = a + b x u_i + c x l_i
    start_i = max(a_i x arrival_scale, finish_{i-1}),  finish_i = start_i + prefill_i
    QTTFT_i = finish_i - a_i x arrival_scale
The CPU tier exists only with --hbm-capacity H < C: tiers are inclusive, HBM behaves like the same
policy with H blocks, so l_i = hit_C(i) - hit_H(i) tokens (hit in the big cache, missed in HBM).

Presets (A800-80GB, bf16, the paper's models): b = 2 x params / (peak FLOP/s x TP x MFU) with 312 TFLOP/s
and MFU 0.5; a = 15 ms (scheduling, sampling, one decode step); c = KV bytes per token / (PCIe 25 GB/s
x TP), no overlap (layer-wise async swap would hide part of it). Every value can be overridden, and
`calibrate_from_replay` fits a, b by least squares to a real engine's records.

Saturation: the queue's utilization is rho = total prefill time / arrival span (first to last arrival,
scaled). With rho >= 1 one instance cannot keep up: the backlog, hence QTTFT, grows with the trace's
length instead of settling. floor(rho) + 1 instances (requests spread evenly) bring each below 1.
"""

from __future__ import annotations

import json
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


def override(model: CostModel, *, overhead_s: float | None = None, s_per_token: float | None = None,
             s_per_loaded_token: float | None = None, arrival_scale: float | None = None) -> CostModel:
    """MODEL with the given values replaced."""
    changes: dict[str, float] = {k: v for k, v in {"overhead_s": overhead_s, "s_per_token": s_per_token,
                                 "s_per_loaded_token": s_per_loaded_token,
                                 "arrival_scale": arrival_scale}.items() if v is not None}
    for k, v in changes.items():
        if not (v >= 0 and math.isfinite(v)):
            raise UsageError(f"cost model {k} must be a finite number >= 0, got {v}")
    if changes.get("arrival_scale") == 0:
        raise UsageError("cost model arrival_scale must be > 0, got 0.0")
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


def calibrate_from_replay(run_path: Path, base: CostModel) -> CostModel:
    """BASE with a, b taken from a real engine: RUN/replay/cost_model.json (schema kvtrace.cost/1, written
    by `kvtrace replay`: ttft_s = a_s + b_s_per_token x (prompt_tokens - cached_tokens)) when present,
    else a least-squares fit over every ok line of RUN/replay/*/records.jsonl (ttft_ms, prompt_tokens,
    cached_tokens)."""
    root = Path(run_path) / "replay"
    fitted = root / "cost_model.json"
    if fitted.is_file():
        from tongyi_trace.run import read_artifact

        doc = read_artifact(fitted) or {}  # refuses another run's cost model (run identity)
        try:
            a, b = float(doc["a_s"]), float(doc["b_s_per_token"])
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"{fitted}: field a_s/b_s_per_token unreadable ({e}); re-run 'kvtrace replay'") from e
        return replace(base, name=f"{base.name}+replay", overhead_s=max(a, 0.0), s_per_token=max(b, 0.0))
    files = sorted(root.glob("*/records.jsonl"))
    if not files:
        raise InputError(f"{run_path}: no replay/cost_model.json or replay/*/records.jsonl; "
                         "run 'kvtrace replay' first")
    xs: list[float] = []
    ys: list[float] = []
    for f in files:
        for lineno, line in enumerate(f.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if rec.get("status", "ok") != "ok" or rec.get("ttft_ms") is None:
                    continue
                ttft = float(rec["ttft_ms"]) / 1000.0
                unc = float(rec["prompt_tokens"]) - float(rec.get("cached_tokens") or 0)
            except (ValueError, KeyError, TypeError) as e:
                raise InputError(f"{f}:{lineno}: field ttft_ms/prompt_tokens/cached_tokens unreadable ({e}); "
                                 "re-run 'kvtrace replay'") from e
            xs.append(unc)
            ys.append(ttft)
    if len(xs) < 2:
        raise InputError(f"{run_path}: fewer than 2 completed replay records; replay more requests")
    x = np.array(xs)
    y = np.array(ys)
    design = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    if b < 0:
        a, b = float(y.mean()), 0.0
    return replace(base, name=f"{base.name}+replay", overhead_s=max(float(a), 0.0), s_per_token=float(b))

"""`kvtrace replay --sweep`: a load sweep against a server, one replay per load point, with goodput under
SLOs, as vLLM's `vllm bench serve` reports it (request and token throughput, TTFT / TPOT / ITL / E2E mean,
median and P99, goodput).

Load points:
- `rate=R1,R2,...`: the selected requests keep the trace's own arrival pattern (its bursts, sessions and
  reuse times), scaled in time to a mean rate of R requests/s: speedup = R x (last - first arrival) /
  (requests - 1). (vLLM's benchmark draws Poisson arrivals instead; a trace's pattern is what its KV reuse
  depends on.)
- `concurrency=N1,N2,...`: closed loop: every request is due at once (speedup inf) and at most N are in
  flight (--max-in-flight N), as `vllm bench serve --max-concurrency N --request-rate inf`.
Each point is an ordinary replay, RUN/replay/NAME-<kind><value>/ (records, summary, reconciliation), with
the cache reset first when --reset-cache is given; RUN/replay/NAME/sweep.json (schema kvtrace.sweep/1)
holds the table.

Goodput (vLLM's definition): requests per second that finished ok and met every SLO given, over the point's
span (first send to last completion, as its throughput): TTFT <= ttft_ms, TPOT <= tpot_ms, end-to-end <=
e2e_ms. A request with one output token has no TPOT and meets a TPOT SLO (vLLM counts its TPOT as 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from tongyi_trace.errors import UsageError
from tongyi_trace.replay.records import read_records
from tongyi_trace.replay.runner import ReplayOptions, ReplayResult, run_replay
from tongyi_trace.replay.schedule import build_schedule, tagged_requests
from tongyi_trace.run import RunDir, open_run
from tongyi_trace.schemas import SWEEP_SCHEMA

SWEEP_KINDS = ("rate", "concurrency")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")  # vllm bench serve --goodput ttft:MS tpot:MS e2el:MS


@dataclass(frozen=True)
class SweepSpec:
    """The load points of a sweep: KIND (rate: requests/s, concurrency: requests in flight) and its values."""

    kind: str
    values: tuple[float, ...]

    def point_name(self, name: str, value: float) -> str:
        """The replay name of one point: NAME-rate4, NAME-concurrency2."""
        return f"{name}-{self.kind}{value:g}"


def parse_sweep(text: str) -> SweepSpec:
    """`rate=1,2,4,8` or `concurrency=1,4` as a SweepSpec; a UsageError saying what to give otherwise."""
    kind, sep, rest = text.partition("=")
    kind = kind.strip()
    example = "e.g. --sweep rate=1,2,4,8 or --sweep concurrency=1,4,16"
    if not sep or kind not in SWEEP_KINDS:
        raise UsageError(f"--sweep {text!r}: give {' or '.join(SWEEP_KINDS)} and its values, {example}")
    try:
        values = tuple(float(v) for v in rest.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"--sweep {text!r}: the values must be numbers, {example}") from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise UsageError(f"--sweep {text!r}: give one or more finite numbers > 0, {example}")
    if kind == "concurrency" and any(v != int(v) for v in values):
        raise UsageError(f"--sweep {text!r}: a concurrency is a whole number of requests in flight")
    if len(set(values)) != len(values):
        raise UsageError(f"--sweep {text!r}: a value is given twice")
    return SweepSpec(kind, values)


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms=50` (any of SLO_KEYS) as {key: limit in ms}; None or "" -> no SLO."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise UsageError(f"--slo {text!r}: give KEY=MS pairs with KEY one of {', '.join(SLO_KEYS)}, "
                             "e.g. --slo ttft_ms=500,tpot_ms=50")
        try:
            limit = float(value)
        except ValueError:
            limit = math.nan
        if not (math.isfinite(limit) and limit > 0):
            raise UsageError(f"--slo {key}={value.strip()}: give a number of milliseconds > 0")
        slo[key] = limit
    return slo


def meets_slo(records: pl.DataFrame, slo: dict[str, float]) -> pl.Series:
    """Per record: finished ok and within every SLO limit (a missing TPOT, one output token, meets it)."""
    good = records["status"] == "ok"
    for key, limit in slo.items():
        value = records[key].fill_null(0.0) if key == "tpot_ms" else records[key]
        good = good & (value <= limit).fill_null(False)
    return good.rename("meets_slo")


def point_row(kind: str, value: float, summary: dict[str, Any], records: pl.DataFrame,
              slo: dict[str, float]) -> dict[str, Any]:
    """One row of the sweep: the load point, what vllm bench serve reports (from the replay's summary) and the
    goodput under SLO (from its records)."""
    counts = summary.get("counts") or {}
    tput = summary.get("throughput") or {}
    span_s = tput.get("span_s")
    num_good = int(meets_slo(records, slo).sum()) if records.height else 0

    def stats(key: str) -> dict[str, float | None]:
        d = summary.get(key) or {}
        return {"mean": d.get("mean"), "median": d.get("p50"), "p99": d.get("p99")}

    return {
        kind: value, "replay": summary.get("name"), "speedup": (summary.get("options") or {}).get("speedup"),
        "max_in_flight": (summary.get("options") or {}).get("max_in_flight"),
        "num_ok": counts.get("num_ok"), "num_error": counts.get("num_error"), "duration_s": span_s,
        "requests_per_s": tput.get("requests_per_s"), "output_tokens_per_s": tput.get("output_tokens_per_s"),
        "total_tokens_per_s": tput.get("total_tokens_per_s"),
        "ttft_ms": stats("ttft_ms"), "tpot_ms": stats("tpot_ms"), "itl_ms": stats("itl_ms"),
        "e2e_ms": stats("e2e_ms"), "drift_ms": stats("drift_ms"),
        "num_good": num_good, "goodput_per_s": num_good / span_s if span_s else None,
        "engine_hit_ratio": summary.get("records_hit_ratio"),
    }


def native_span(run_dir: str | Path, opts: ReplayOptions) -> tuple[int, float]:
    """(requests, seconds from the first to the last arrival) of the replay's selection at speedup 1 (the
    server's length limit aside)."""
    run = open_run(run_dir)
    sched = build_schedule(tagged_requests(run, opts.policy_file), replace(opts.schedule, speedup=1.0), None)
    return len(sched.requests), (sched.requests[-1].scheduled_s if sched.requests else 0.0)


def point_options(spec: SweepSpec, value: float, opts: ReplayOptions, num_requests: int,
                  span_s: float) -> ReplayOptions:
    """The replay options of one load point (see the module's docstring)."""
    name = spec.point_name(opts.name, value)
    if spec.kind == "concurrency":
        return replace(opts, name=name, max_in_flight=int(value), schedule=replace(opts.schedule, speedup=math.inf))
    if num_requests < 2 or span_s <= 0:
        raise UsageError(f"--sweep rate: the {num_requests} selected requests arrive all at once, so no rate "
                         "scales them; use --sweep concurrency=... or widen --duration/--max-requests")
    return replace(opts, name=name, schedule=replace(opts.schedule, speedup=value * span_s / (num_requests - 1)))


@dataclass(frozen=True)
class SweepResult:
    """The sweep's document (sweep.json) and where it is."""

    path: Path
    doc: dict[str, Any]


def run_sweep(run_dir: str | Path, server: str, opts: ReplayOptions, spec: SweepSpec, slo: dict[str, float],
              on_point: Callable[[str, float, ReplayResult], None] | None = None,
              replay: Callable[[ReplayOptions], ReplayResult] | None = None) -> SweepResult:
    """Replay RUN_DIR against SERVER once per load point of SPEC (in the order given), then write
    RUN/replay/NAME/sweep.json with a row per point (point_row). ON_POINT(kind, value, result) after each
    point; REPLAY runs one point (default: run_replay with its options)."""
    num_requests, span_s = native_span(run_dir, opts)
    plans = [(v, point_options(spec, v, opts, num_requests, span_s)) for v in spec.values]  # all checked first
    run = open_run(run_dir)
    with run.lock():
        return _sweep(run, server, opts, spec, slo, plans, (num_requests, span_s), on_point,
                      replay or (lambda o: run_replay(run_dir, server, o)))


def _sweep(run: RunDir, server: str, opts: ReplayOptions, spec: SweepSpec, slo: dict[str, float],
           plans: list[tuple[float, ReplayOptions]], native: tuple[int, float],
           on_point: Callable[[str, float, ReplayResult], None] | None,
           go: Callable[[ReplayOptions], ReplayResult]) -> SweepResult:
    out = run.path / "replay" / opts.name
    if (out / "summary.json").exists():
        raise UsageError(f"{out} holds a replay, not a sweep; pick another --name")
    if (out / "sweep.json").exists() and not opts.overwrite:
        raise UsageError(f"{out} already holds a sweep; pick another --name or pass --overwrite")
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"schema": SWEEP_SCHEMA, "name": opts.name, "server": server, "kind": spec.kind,
                           "values": list(spec.values), "slo": slo, "status": "running", "rows": rows,
                           "trace_requests": native[0], "trace_span_s": native[1]}
    out.mkdir(parents=True, exist_ok=True)
    for value, point_opts in plans:
        try:
            res = go(point_opts)
        except BaseException as e:  # a point that could not run (server gone, a stop before it started)
            doc["status"], doc["error"] = ("interrupted" if isinstance(e, KeyboardInterrupt) else "failed",
                                           f"{point_opts.name}: {e}")
            run.write_artifact(out / "sweep.json", doc)
            raise
        rows.append(point_row(spec.kind, value, res.summary, read_records(res.out_dir / "records.jsonl"), slo))
        run.write_artifact(out / "sweep.json", doc)  # a sweep stopped half-way keeps its finished points
        if on_point is not None:
            on_point(spec.kind, value, res)
        if res.summary.get("status") != "complete":
            doc["status"], doc["error"] = str(res.summary.get("status")), res.summary.get("error")
            break
    else:
        doc["status"] = "complete"
    run.write_artifact(out / "sweep.json", doc)
    return SweepResult(out / "sweep.json", doc)

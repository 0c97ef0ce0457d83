"""Side-by-side comparison of two replays of the same trace slice (e.g. stock LRU vs the WA plugin).

For each replay (RUN_DIR/replay/NAME: summary.json, records.jsonl) it reports:
- the engine hit ratio: engine-reported cached tokens / prompt tokens over the replay's completed
  requests (records.jsonl, status ok: also for an interrupted replay whose summary is incomplete), by
  `tongyi_trace.replay.metrics.records_hit_ratio`: requests without cached_tokens are left out and
  counted in a note;
- the simulator's prediction for each policy at the engine's block size and block count (called as
  the replay's reconciliation calls it), on the same requests in the same order: LRU from the
  replay's own reconciliation, WA (and LRU when missing) from
  `tongyi_trace.sim.engine_model.predict_request_hits` with the policy file the plugin ran (or --policy);
  WA and `fitted` with the guard and refit the plugin was started with (`guard_params`: its stats'
  `guard_settings`; WA's defaults, the guard on, without the plugin) through
  `tongyi_trace.sim.guarded.predict_guarded`;
- TTFT mean / P50 / P99 (ms, QTTFT: queueing included) over the same records (P = linear
  interpolation between order statistics);
- the plugin's counters over the replay window (summary.plugin, else plugin_stats.json in the replay
  folder: schema kvtrace.plugin_stats/1, see tongyi_trace.vllm_plugin.stats): evictions decided,
  decision time mean / P99 (us), fallbacks, evictions per category.
and B - A for each figure. The paper's comparison: QTTFT and hit ratio, WA vs baselines (section 5).

Paired intervals (`paired_intervals`) of the engine hit-ratio difference (B - A, points) and of the mean
TTFT change (B over A, %), from the one block bootstrap of tongyi_trace.sim.bootstrap: requests of A and
B are matched by their trace request index (req_idx); only requests finished OK in both count (the
others are counted and named in a note); a request without cached_tokens (or without a TTFT) in either
replay is left out of that figure on both sides (counted). The resampling units are the matched
requests' sessions (records' session_id), or consecutive slices of their schedule when the trace has no
sessions; both replays are scored on the same resample, so a replay against itself gives exactly [0, 0].
The engine is not re-run per resample: the interval is the sampling noise of the workload, given what
each request got in each replay (run-to-run noise of the engine is not in it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import InputError, UsageError
from tongyi_trace.policy.file import PolicyParams, load_policy
from tongyi_trace.replay.metrics import records_hit_ratio
from tongyi_trace.replay.reconcile import guard_params, predict_hits
from tongyi_trace.run import RunDir, is_run_dir, open_run, read_artifact, write_json
from tongyi_trace.schemas import COMPARE_SCHEMA, REPLAY_SCHEMA
from tongyi_trace.sim.bootstrap import (
    DEFAULT_CONFIDENCE,
    Interval,
    check_confidence,
    make_resampler,
    request_groups,
)
from tongyi_trace.vllm_plugin.stats import read_stats

SIM_POLICIES = ("lru", "wa", "fitted")  # fitted: what the policy file chose for the engine's cache size


@dataclass
class ReplaySide:
    """The figures of one replay."""

    name: str
    replay_dir: str
    run_dir: str
    eviction: str
    num_requests: int | None
    num_gpu_blocks: int | None
    block_size: int | None
    engine_hit_ratio: float | None
    num_without_cached_tokens: int | None  # completed requests left out of engine_hit_ratio
    predicted_hit_ratio: dict[str, float | None]
    ttft_ms: dict[str, float | None]
    plugin: dict[str, Any] | None
    policy_path: str | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class PairedIntervals:
    """The paired bootstrap intervals of B against A over the requests finished OK in both."""

    confidence: float
    resampled: str  # "sessions" or "time slices"
    num_groups: int
    num_resamples: int
    num_paired: int  # requests finished OK in both replays (matched by req_idx)
    num_only_a: int  # finished OK in A only (left out)
    num_only_b: int  # finished OK in B only (left out)
    num_without_cached_tokens: int  # paired requests left out of the hit ratio (no cached_tokens in A or B)
    num_without_ttft: int  # paired requests left out of the TTFT change (no ttft_ms in A or B)
    engine_hit_ratio_pp: Interval | None  # B - A, points
    ttft_mean_change_pct: Interval | None  # mean TTFT of B over A's - 1, percent

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the intervals as {point, lo, hi, confidence}, null when there is none)."""
        out = dict(self.__dict__)
        for key in ("engine_hit_ratio_pp", "ttft_mean_change_pct"):
            got = out[key]
            out[key] = got.to_json() if got is not None else None
        return out

    def notes(self) -> list[str]:
        """What was left out of the intervals, one line each (nothing when nothing was)."""
        out = []
        if self.num_only_a or self.num_only_b:
            out.append(f"intervals: {self.num_only_a} request(s) finished OK in A only and {self.num_only_b} in B "
                       f"only are left out ({self.num_paired} paired)")
        if self.num_without_cached_tokens:
            out.append(f"intervals: {self.num_without_cached_tokens} paired request(s) without cached_tokens in A "
                       "or B are left out of the hit-ratio interval")
        if self.num_without_ttft:
            out.append(f"intervals: {self.num_without_ttft} paired request(s) without a TTFT in A or B are left "
                       "out of the TTFT interval")
        return out


@dataclass(frozen=True)
class Comparison:
    """Two replays side by side, their differences (B - A), and where it was written."""

    a: ReplaySide
    b: ReplaySide
    diff: dict[str, float | None]
    notes: list[str]
    output_path: Path | None
    intervals: PairedIntervals | None = None

    def to_json(self) -> dict[str, Any]:
        """The `kvtrace.compare/1` document."""
        return {"schema": COMPARE_SCHEMA, "a": self.a.to_json(), "b": self.b.to_json(), "diff": self.diff,
                "intervals": self.intervals.to_json() if self.intervals is not None else None,
                "notes": self.notes}


def resolve_replay(path: str | Path) -> Path:
    """A replay folder (holding summary.json), or a run folder holding exactly one replay."""
    p = Path(path)
    if (p / "summary.json").is_file():
        schema = read_artifact(p / "summary.json").get("schema")
        if schema != REPLAY_SCHEMA:  # e.g. RUN/sim (a simulate sweep) or RUN/analysis
            raise InputError(f"{p}: not a replay (its summary.json is {schema!r}, a replay's is {REPLAY_SCHEMA!r}); "
                             "give a replay folder RUN/replay/NAME, or a run folder holding one replay")
        return p
    if (p / "replay").is_dir():
        found = sorted(d for d in (p / "replay").iterdir() if (d / "summary.json").is_file())
        if len(found) == 1:
            return found[0]
        if found:
            names = ", ".join(d.name for d in found)
            raise UsageError(f"{p} holds several replays ({names}); pass one as {p}/replay/NAME")
    raise InputError(f"{p}: no replay here (no summary.json, no replay/NAME/summary.json); "
                     "run 'kvtrace replay' first")


def _plugin_stats(replay_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    got = summary.get("plugin")
    if isinstance(got, dict) and got:
        return got
    return read_stats(replay_dir / "plugin_stats.json")


def _ok_records(replay_dir: Path) -> pl.DataFrame:
    """The replay's completed requests in send order (the simulator replays them in that order)."""
    from tongyi_trace.replay.records import read_records

    return read_records(replay_dir / "records.jsonl").filter(pl.col("status") == "ok").sort("sent_s")


def _predict(run: RunDir, recs: pl.DataFrame, policy: str, params: PolicyParams | None,
             block_size: int, num_gpu_blocks: int, guard: dict[str, Any]) -> float:
    """Simulator token hit ratio of POLICY on RECS, as the replay's reconciliation predicts it."""
    hits = predict_hits(run, recs, block_size, num_gpu_blocks, policy, params, guard)
    prompt = int(recs["prompt_tokens"].sum() or 0)
    return float(hits.sum()) / prompt if prompt else 0.0


def _ttft(recs: pl.DataFrame) -> dict[str, float | None]:
    vals = recs["ttft_ms"].drop_nulls()
    if vals.len() == 0:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": float(vals.mean()),  # type: ignore[arg-type]
            "p50": float(vals.quantile(0.50, "linear")),  # type: ignore[arg-type]
            "p99": float(vals.quantile(0.99, "linear"))}  # type: ignore[arg-type]


def load_side(path: str | Path, policy_override: Path | None = None) -> ReplaySide:
    """Read one replay's figures and add the simulator's predictions for LRU and WA."""
    replay_dir = resolve_replay(path)
    summary = read_artifact(replay_dir / "summary.json")
    run_dir = replay_dir.resolve().parent.parent  # RUN of RUN/replay/NAME (never '.' for a relative path)
    notes: list[str] = []
    engine_info = summary.get("engine") or {}
    plugin = _plugin_stats(replay_dir, summary)
    eviction = plugin.get("mode", "?") if plugin else (
        (summary.get("options") or {}).get("eviction") or "lru (vLLM, no plugin)")
    recs = _ok_records(replay_dir) if (replay_dir / "records.jsonl").is_file() else None
    engine_hits = records_hit_ratio(recs) if recs is not None else None
    if engine_hits is not None and engine_hits.note():
        notes.append(str(engine_hits.note()))
    predicted: dict[str, float | None] = {p: None for p in SIM_POLICIES}
    policy_path = policy_override or (Path(plugin["policy_path"]) if plugin and plugin.get("policy_path")
                                      else None)
    params = None
    if policy_path is not None:
        try:
            params = load_policy(policy_path)
        except InputError as e:
            notes.append(f"WA prediction skipped: {e}")
    else:
        notes.append("WA prediction skipped: no policy file (the plugin did not run; pass --policy)")
    bs, nb = engine_info.get("block_size"), engine_info.get("num_gpu_blocks")
    if recs is None or recs.height == 0 or bs is None or nb is None:
        notes.append("no completed records or engine block figures (vllm:cache_config_info): simulator "
                     "predictions unavailable")
    elif not is_run_dir(run_dir):
        notes.append(f"{replay_dir.resolve()} is not inside a run folder (RUN/replay/NAME; {run_dir} is none): "
                     "simulator predictions unavailable")
    else:
        run = open_run(run_dir)
        for pol in SIM_POLICIES:
            if pol in ("wa", "fitted") and params is None:
                continue
            try:
                predicted[pol] = _predict(run, recs, pol, params, int(bs), int(nb), guard_params(plugin))
            except ImportError as e:
                notes.append(f"simulator engine model unavailable ({e})")
                break
    return ReplaySide(
        name=str(summary.get("name") or replay_dir.name), replay_dir=str(replay_dir), run_dir=str(run_dir),
        eviction=str(eviction), num_requests=recs.height if recs is not None else None,
        num_gpu_blocks=nb, block_size=bs,
        engine_hit_ratio=engine_hits.hit_ratio if engine_hits is not None else None,
        num_without_cached_tokens=engine_hits.num_without_cached_tokens if engine_hits is not None else None,
        predicted_hit_ratio=predicted,
        ttft_ms=_ttft(recs) if recs is not None else {"mean": None, "p50": None, "p99": None},
        plugin=plugin, policy_path=str(policy_path) if policy_path else None, notes=notes)


_PAIR_COLUMNS = ["req_idx", "session_id", "scheduled_s", "prompt_tokens", "cached_tokens", "ttft_ms"]


def paired_intervals(recs_a: pl.DataFrame, recs_b: pl.DataFrame,
                     confidence: float = DEFAULT_CONFIDENCE) -> PairedIntervals:
    """The paired bootstrap intervals of B against A: engine hit ratio B - A (points) and mean TTFT of B over
    A (percent), over the requests finished OK in both (RECS_A, RECS_B: the replays' OK records), matched by
    req_idx and resampled by session (else by time slice of A's schedule)."""
    a = recs_a.select(_PAIR_COLUMNS)
    b = recs_b.select(_PAIR_COLUMNS)
    for side, recs in (("A", a), ("B", b)):
        twice = recs.filter(pl.col("req_idx").is_duplicated())["req_idx"]
        if twice.len():
            raise InputError(f"replay {side}: request {twice[0]} finished OK twice in records.jsonl; a replay sends "
                             "each request once: re-run that replay")
    both = a.join(b, on="req_idx", how="inner", suffix="_b").sort("req_idx")
    res = make_resampler(request_groups(both["session_id"].to_numpy(), both["scheduled_s"].to_numpy()),
                         confidence=confidence)
    hit_ok = (both["cached_tokens"].is_not_null() & both["cached_tokens_b"].is_not_null()).to_numpy()
    ttft_ok = (both["ttft_ms"].is_not_null() & both["ttft_ms_b"].is_not_null()).to_numpy()

    def masked(col: str, ok: np.ndarray) -> np.ndarray:
        return np.where(ok, both[col].fill_null(0).to_numpy().astype(np.float64), 0.0)

    hit: Interval | None = None
    ca, pa = masked("cached_tokens", hit_ok), masked("prompt_tokens", hit_ok)
    cb, pb = masked("cached_tokens_b", hit_ok), masked("prompt_tokens_b", hit_ok)
    if pa.sum() > 0 and pb.sum() > 0:  # B's ratio minus A's on every resample (the prompts may differ)
        point = 100.0 * (cb.sum() / pb.sum() - ca.sum() / pa.sum())
        hit = res.interval(point, 100.0 * (res.ratio(cb, pb) - res.ratio(ca, pa)))
    ttft: Interval | None = None
    ta, tb = masked("ttft_ms", ttft_ok), masked("ttft_ms_b", ttft_ok)
    if ta.sum() > 0:  # the same requests on both sides: mean over mean = sum over sum
        ttft = res.mean_change(tb, ta)
        if not math.isfinite(ttft.point):
            ttft = None
    return PairedIntervals(
        confidence=res.confidence, resampled=_grouping(both), num_groups=res.num_groups,
        num_resamples=res.num_resamples, num_paired=both.height, num_only_a=a.height - both.height,
        num_only_b=b.height - both.height, num_without_cached_tokens=int((~hit_ok).sum()),
        num_without_ttft=int((~ttft_ok).sum()), engine_hit_ratio_pp=hit, ttft_mean_change_pct=ttft)


def _grouping(both: pl.DataFrame) -> str:
    """What the bootstrap resampled (request_groups' rule): sessions when fewer sessions than requests."""
    return "sessions" if both.height and both["session_id"].n_unique() < both.height else "time slices"


def unfinished_note(label: str, side: ReplaySide, summary: dict[str, Any]) -> str | None:
    """What a comparison must say of a replay whose SUMMARY is not "complete" (None when it is): a replay killed
    hard (its summary still says "running"), stopped or failed covers only the requests it recorded."""
    status = summary.get("status")
    if status == "complete":
        return None
    covered = f"its figures cover the {side.num_requests or 0} requests it completed"
    if status in (None, "running"):
        return (f"replay {label} ({side.name}) never finished: its summary says 'running' (it was killed, or "
                f"still runs); {covered}; rebuild its summary with 'kvtrace replay {side.run_dir} --name "
                f"{Path(side.replay_dir).name} --reconcile-only'")
    why = f": {summary['error']}" if summary.get("error") else ""
    return f"replay {label} ({side.name}) is {status}{why}; {covered}"


def _sub(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a


def compare_replays(replay_a: str | Path, replay_b: str | Path, policy: Path | None = None,
                    output: Path | None = None, confidence: float = DEFAULT_CONFIDENCE) -> Comparison:
    """Compare two replays, with the paired intervals of B against A at CONFIDENCE; write the
    `kvtrace.compare/1` document (default: next to replay A)."""
    check_confidence(confidence)
    a = load_side(replay_a, policy)
    b = load_side(replay_b, policy)
    notes: list[str] = []
    intervals = None
    files = [Path(side.replay_dir) / "records.jsonl" for side in (a, b)]
    if all(f.is_file() for f in files):
        intervals = paired_intervals(_ok_records(files[0].parent), _ok_records(files[1].parent), confidence)
        notes += intervals.notes()
    else:
        notes.append("no intervals: a replay has no records.jsonl")
    sa, sb = read_artifact(Path(a.replay_dir) / "summary.json"), read_artifact(Path(b.replay_dir) / "summary.json")
    notes += [n for label, side, s in (("A", a, sa), ("B", b, sb)) if (n := unfinished_note(label, side, s))]
    if (sa.get("trace") or {}).get("source") != (sb.get("trace") or {}).get("source"):
        notes.append("the two replays come from different traces: the comparison is not like for like")
    if a.num_requests != b.num_requests:
        notes.append(f"completed requests differ ({a.num_requests} vs {b.num_requests})")
    if a.num_gpu_blocks != b.num_gpu_blocks:
        notes.append(f"engine block counts differ ({a.num_gpu_blocks} vs {b.num_gpu_blocks})")
    diff: dict[str, float | None] = {
        "engine_hit_ratio": _sub(b.engine_hit_ratio, a.engine_hit_ratio),
        "ttft_mean_ms": _sub(b.ttft_ms["mean"], a.ttft_ms["mean"]),
        "ttft_p50_ms": _sub(b.ttft_ms["p50"], a.ttft_ms["p50"]),
        "ttft_p99_ms": _sub(b.ttft_ms["p99"], a.ttft_ms["p99"]),
    }
    for pol in SIM_POLICIES:
        diff[f"predicted_{pol}_hit_ratio"] = _sub(b.predicted_hit_ratio[pol], a.predicted_hit_ratio[pol])
    for side in (a, b):
        pred = side.predicted_hit_ratio.get(side.eviction if side.eviction in SIM_POLICIES else "lru")
        if side.engine_hit_ratio is not None and pred is not None:
            side.notes.append(f"engine - simulator ({side.eviction if side.eviction in SIM_POLICIES else 'lru'})"
                              f" = {100 * (side.engine_hit_ratio - pred):+.2f} points")
    out = output or Path(a.replay_dir).parent / f"compare_{a.name}_vs_{b.name}.json"
    comp = Comparison(a=a, b=b, diff=diff, notes=notes, output_path=out, intervals=intervals)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, comp.to_json())
    return comp

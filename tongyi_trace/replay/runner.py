"""`kvtrace replay`: replay a run folder's requests against a live vLLM server and reconcile the hits.

Order of work: probe the server (GET /v1/models: model name, max_model_len; unreachable -> one-line
error before anything starts), scrape /metrics, build the schedule, dispatch (records.jsonl grows as
requests finish), scrape /metrics again, then write the reconciliation against the simulator
(reconcile.parquet), the TTFT cost fit (cost_model.json) and summary.json. summary.json is written with
status "running" first and rewritten at the end ("complete", "interrupted" after Ctrl-C, "failed" after a
crash), so every outcome leaves the finished records and a summary. Artifacts: docs/artifacts/replay.md.
Several servers (--server URL1,URL2,... --router R): each request goes to the engine the fleet simulator's
router picks (replay/fleet.py, routing.parquet), and the reconciliation is per instance.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import polars as pl

from tongyi_trace import __version__
from tongyi_trace.artifact_set import commit_sets, staging_dir
from tongyi_trace.engine.model import VOCAB_SIZE
from tongyi_trace.engine.process import local_engine_at
from tongyi_trace.errors import EngineError, InputError, KvtraceError, UsageError
from tongyi_trace.replay.cost import fit_ttft_cost
from tongyi_trace.replay.dispatch import DispatchOptions, DispatchState, dispatch
from tongyi_trace.replay.metrics import MetricsSnapshot, delta_hit_ratio, records_hit_ratio, snapshot_from_text
from tongyi_trace.replay.prompts import DEFAULT_MIN_TOKEN_ID, PromptSynth
from tongyi_trace.replay.reconcile import reconcile
from tongyi_trace.replay.records import RecordWriter, read_records
from tongyi_trace.replay.schedule import (
    Schedule,
    ScheduledRequest,
    ScheduleOptions,
    build_schedule,
    tagged_requests,
)
from tongyi_trace.run import RunDir, open_run, write_parquet_atomic
from tongyi_trace.schemas import REPLAY_SCHEMA
from tongyi_trace.stops import stop_signals_interrupt
from tongyi_trace.vllm_plugin.stats import STATS_FILE, read_settled_stats, read_stats, stats_delta

if TYPE_CHECKING:
    from tongyi_trace.replay.fleet import FleetRouting


@dataclass(frozen=True)
class ReplayOptions:
    """Everything `kvtrace replay` takes besides the run folder and server."""

    name: str = "default"
    model: str | None = None
    schedule: ScheduleOptions = field(default_factory=ScheduleOptions)
    vocab_size: int | None = None  # None: what the server says (server_vocab_size), else VOCAB_SIZE
    min_token_id: int = DEFAULT_MIN_TOKEN_ID
    seed: int = 0
    max_in_flight: int | None = None
    api_key: str | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 3  # re-sends of a request the server answers HTTP 429/503 (after its Retry-After)
    engine_block_size: int | None = None
    engine_num_blocks: int | None = None
    overwrite: bool = False
    reset_cache: bool = False
    plugin_stats: Path | None = None
    policy_file: Path | None = None  # tag requests with this policy's categories (default: RUN/fit/policy.json)
    router: str | None = None  # several servers: the fleet router (fleet/routers) that spreads the requests


@dataclass(frozen=True)
class ServerInfo:
    """What the server says about itself before the replay."""

    url: str
    model: str
    max_model_len: int | None
    metrics: MetricsSnapshot | None
    vocab_size: int | None = None  # the model's ordinary tokens, when the server says (server_vocab_size)
    vocab_source: str | None = None  # where vocab_size came from


@dataclass(frozen=True)
class ReplayResult:
    """Where the artifacts are and the summary that was written."""

    out_dir: Path
    summary: dict[str, Any]


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _tls(url: str) -> bool:
    """Verify certificates for https only (building a verifying TLS context costs ~0.3 s per call)."""
    return url.startswith("https://")


def scrape_metrics(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> MetricsSnapshot | None:
    """One /metrics scrape, or None when the server exports none."""
    try:
        r = httpx.get(f"{url}/metrics", headers=_headers(api_key), timeout=timeout_s, verify=_tls(url))
    except httpx.HTTPError:
        return None
    return snapshot_from_text(r.text) if r.status_code == 200 else None


def public_url(url: str) -> str:
    """URL without its user:password@ part: what a summary, the report or a message may show."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1", url)


def reset_prefix_cache(url: str, api_key: str | None = None) -> None:
    """POST /reset_prefix_cache (vLLM with VLLM_SERVER_DEV_MODE=1, as `kvtrace engine start` runs it)."""
    try:
        r = httpx.post(f"{url}/reset_prefix_cache", headers=_headers(api_key), timeout=30.0, verify=_tls(url))
    except httpx.HTTPError as e:
        raise EngineError(f"server {public_url(url)}: POST /reset_prefix_cache failed ({type(e).__name__})") from None
    if r.status_code != 200:
        raise EngineError(f"server {public_url(url)}: POST /reset_prefix_cache answered HTTP {r.status_code}; the "
                          "server needs VLLM_SERVER_DEV_MODE=1 and no request in flight (or drop --reset-cache)")


def probe_server(url: str, model: str | None, api_key: str | None, reset_cache: bool = False) -> ServerInfo:
    """Check the server answers and serves MODEL (or pick its only/first model); raise EngineError if not."""
    url = url.rstrip("/")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"--server {public_url(url)!r}: not a valid URL; give one such as http://127.0.0.1:8000")
    try:
        r = httpx.get(f"{url}/v1/models", headers=_headers(api_key), timeout=10.0, verify=_tls(url))
    except httpx.TimeoutException as e:
        raise EngineError(f"server {public_url(url)} accepted the connection but did not answer GET /v1/models within "
                          f"10 s ({type(e).__name__}); is it still starting, or stuck?") from None
    except httpx.HTTPError as e:
        raise EngineError(f"server {public_url(url)} unreachable ({type(e).__name__}: {' '.join(str(e).split())}); "
                          "start one with 'kvtrace engine start' or check --server") from None
    if r.status_code in (401, 403):
        raise EngineError(f"server {public_url(url)} refused GET /v1/models (HTTP {r.status_code}); "
                          "pass the key's environment variable with --api-key-env VAR")
    if r.status_code != 200:
        raise EngineError(f"server {public_url(url)}: GET /v1/models answered HTTP {r.status_code}; is it an "
                          "OpenAI-compatible vLLM server?")
    try:
        cards = r.json()["data"]
        ids = [c["id"] for c in cards]
    except (ValueError, KeyError, TypeError) as e:
        raise EngineError(f"server {public_url(url)}: GET /v1/models returned no model list ({e})") from None
    if model is None:
        if not ids:
            raise EngineError(f"server {public_url(url)} serves no model")
        model = ids[0]
    elif model not in ids:
        raise UsageError(f"--model {model!r}: server {public_url(url)} serves {', '.join(ids) or 'nothing'}")
    if reset_cache:
        reset_prefix_cache(url, api_key)
    card = cards[ids.index(model)]
    mml = card.get("max_model_len")
    vocab, source = server_vocab_size(url, card, api_key)
    return ServerInfo(url=url, model=model, max_model_len=int(mml) if isinstance(mml, int) else None,
                      metrics=scrape_metrics(url, api_key), vocab_size=vocab, vocab_source=source)


def server_vocab_size(url: str, card: dict[str, Any], api_key: str | None) -> tuple[int | None, str | None]:
    """The served model's number of ordinary tokens and where it was read, when the server says: a
    `vocab_size` in its /v1/models card; else vLLM's GET /tokenizer_info (served with
    --enable-tokenizer-info-endpoint): its `vocab_size`, or the lowest special token id of its
    added_tokens_decoder (Qwen2: 151643, the ids above are special); else, for a local `kvtrace engine`, its
    model's vocabulary. (None, None) when none says."""
    v = card.get("vocab_size")
    if type(v) is int and v > 1:
        return v, "the server's /v1/models"
    try:
        r = httpx.get(f"{url}/tokenizer_info", headers=_headers(api_key), timeout=10.0, verify=_tls(url))
        info = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        info = None
    if isinstance(info, dict):
        v = info.get("vocab_size")
        if type(v) is int and v > 1:
            return v, "the server's /tokenizer_info"
        added = info.get("added_tokens_decoder")
        ids = [int(k) for k in added if str(k).isdigit()] if isinstance(added, dict) else []
        if ids and min(ids) > 1:
            return min(ids), "the server's /tokenizer_info (its first special token id)"
    if local_engine_at(url) is not None:
        return VOCAB_SIZE, "the local kvtrace engine's model"
    return None, None


class BlockIndex:
    """The block ids and token counts of each request (blocks.parquet), looked up by req_idx."""

    def __init__(self, run: RunDir, req_idx: list[int]) -> None:
        wanted = pl.Series("req_idx", sorted(set(req_idx)), dtype=pl.Int64)
        df = (pl.scan_parquet(run.blocks_path).select("req_idx", "pos", "block_id", "num_tokens")
              .filter(pl.col("req_idx").is_in(wanted.implode())).sort(["req_idx", "pos"]).collect())
        self._req = df["req_idx"].to_numpy()
        self._block = df["block_id"].to_numpy()
        self._ntok = df["num_tokens"].to_numpy()

    def blocks_of(self, req_idx: int) -> tuple[np.ndarray, np.ndarray]:
        """(block ids, tokens in each block) of request REQ_IDX."""
        lo, hi = np.searchsorted(self._req, [req_idx, req_idx + 1])
        return self._block[lo:hi], self._ntok[lo:hi]


def _pcts(values: pl.Series) -> dict[str, float | None]:
    v = values.drop_nulls()
    if v.len() == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    arr = v.to_numpy().astype(np.float64)
    return {"p50": float(np.percentile(arr, 50)), "p90": float(np.percentile(arr, 90)),
            "p99": float(np.percentile(arr, 99)), "max": float(arr.max()), "mean": float(arr.mean())}


def _counters(m: MetricsSnapshot | None) -> dict[str, Any] | None:
    return None if m is None else {"hits_tokens": m.hits_tokens, "queries_tokens": m.queries_tokens,
                                   "block_size": m.block_size, "num_gpu_blocks": m.num_gpu_blocks}


def _selection(s: Schedule) -> dict[str, int]:
    return {"num_in_window": s.num_in_window, "num_sampled_out": s.num_sampled_out,
            "num_too_long": s.num_too_long, "num_over_max_requests": s.num_over_max_requests,
            "num_scheduled": len(s.requests)}


def run_replay(run_dir: str | Path, server: str, opts: ReplayOptions,
               on_start: Callable[[Schedule, ServerInfo], None] | None = None,
               on_update: Callable[[DispatchState], None] | None = None) -> ReplayResult:
    """Replay RUN_DIR's requests against SERVER; write records, reconciliation, cost fit and summary.
    The run folder is held exclusively meanwhile; SIGTERM/SIGHUP stop it like Ctrl-C."""
    run = open_run(run_dir)
    with run.lock():
        return _replay(run, server, opts, on_start, on_update)


def _replay(run: RunDir, server: str, opts: ReplayOptions,
            on_start: Callable[[Schedule, ServerInfo], None] | None,
            on_update: Callable[[DispatchState], None] | None) -> ReplayResult:
    """Options, probe, plan, dispatch: nothing on disk changes before the servers answered and the plan holds
    a request."""
    out_dir, replacing = _check_options(run, opts)
    urls, infos = _probe(server, opts)
    plan = _plan(run, opts, urls, infos)
    return _dispatch(run, opts, plan, out_dir, replacing, on_start, on_update)


def _check_options(run: RunDir, opts: ReplayOptions) -> tuple[Path, bool]:
    """OPTS checked (a UsageError names the first bad one); the replay's folder and whether it replaces one."""
    if not opts.name or "/" in opts.name or opts.name.startswith("."):
        raise UsageError(f"--name {opts.name!r}: use a plain folder name")
    if opts.max_in_flight is not None and opts.max_in_flight < 1:
        raise UsageError(f"--max-in-flight {opts.max_in_flight} must be >= 1")
    for flag, v in (("--engine-block-size", opts.engine_block_size), ("--engine-num-blocks", opts.engine_num_blocks)):
        if v is not None and not 1 <= v < 2**40:
            raise UsageError(f"{flag} {v}: give a positive number of blocks/tokens")
    if opts.vocab_size is not None and opts.vocab_size >= 2**31:
        raise UsageError(f"--vocab-size {opts.vocab_size}: give the model's vocabulary size (< 2^31)")
    if not (opts.request_timeout_s > 0 and math.isfinite(opts.request_timeout_s)):
        raise UsageError(f"--request-timeout-s {opts.request_timeout_s}: give a positive number of seconds")
    if not 0 <= opts.max_retries <= 100:
        raise UsageError(f"--max-retries {opts.max_retries}: give 0 (never retry) to 100")
    out_dir = run.path / "replay" / opts.name
    replacing = out_dir.exists() and any(out_dir.iterdir())
    if replacing and not opts.overwrite:
        raise UsageError(f"{out_dir} already holds a replay; pick another --name or pass --overwrite")
    return out_dir, replacing


def _probe(server: str, opts: ReplayOptions) -> tuple[list[str], list[ServerInfo]]:
    """The servers' urls (several for a fleet replay) and what each says about itself: an unreachable server
    is an error before anything on disk changes (the old replay stays)."""
    urls = [server]
    if opts.router is not None or "," in server:
        from tongyi_trace.replay.fleet import parse_servers

        urls = parse_servers(server, opts.router)
    info = probe_server(urls[0], opts.model, opts.api_key, opts.reset_cache)
    infos = [info] + [probe_server(u, info.model, opts.api_key, opts.reset_cache) for u in urls[1:]]
    return urls, infos


@dataclass
class ReplayPlan:
    """What the dispatch sends: the schedule, the fleet's routing (None: one server), each request's prompt
    and kv_block_keys, and the summary's opening fields."""

    urls: list[str]
    infos: list[ServerInfo]
    sched: Schedule
    routing: FleetRouting | None
    prompt_of: Callable[[ScheduledRequest], tuple[np.ndarray, np.ndarray | None]]
    summary: dict[str, Any]


def _plan(run: RunDir, opts: ReplayOptions, urls: list[str], infos: list[ServerInfo]) -> ReplayPlan:
    """The schedule (within the servers' length limit), the routing, the prompts and the summary's opening."""
    prov = run.provenance()
    info = infos[0]
    sched = build_schedule(tagged_requests(run, opts.policy_file), opts.schedule,
                           min((i.max_model_len for i in infos if i.max_model_len is not None), default=None))
    if not sched.requests:
        raise UsageError(f"no request to replay after selection ({_selection(sched)}); widen --start/"
                         "--duration/--sample-sessions or raise the server's --max-model-len")
    routing = _fleet_routing(run, sched, infos, opts) if len(infos) > 1 else None
    vocab_size, vocab_source = ((opts.vocab_size, "--vocab-size") if opts.vocab_size is not None
                                else (info.vocab_size, info.vocab_source) if info.vocab_size is not None
                                else (VOCAB_SIZE, f"default {VOCAB_SIZE} (the server did not say; pass --vocab-size)"))
    synth = PromptSynth(opts.seed, vocab_size, int(prov["block_size"]), opts.min_token_id)
    index = BlockIndex(run, [r.req_idx for r in sched.requests])
    keys = _block_keys(run, sched, {_engine_figures(i, opts)["block_size"] for i in infos})

    def prompt_of(sr: ScheduledRequest) -> tuple[np.ndarray, np.ndarray | None]:
        ids, ntok = index.blocks_of(sr.req_idx)
        sent, unique_from = keys.get(sr.req_idx, (None, None))
        return synth.prompt(sr.req_idx, ids, ntok, sr.input_tokens, unique_from), sent

    summary: dict[str, Any] = {
        "schema": REPLAY_SCHEMA, "name": opts.name, "status": "running", "error": None,
        "created_by": f"kvtrace {__version__}", "server": public_url(info.url), "model": info.model,
        "started_at": time.time(), "finished_at": None, "wall_s": None,
        "trace": {"source": prov.get("source"), "block_size": prov.get("block_size"),
                  "num_requests": prov.get("num_requests")},
        "options": {**{k: v for k, v in asdict(opts).items() if k not in ("schedule", "api_key")},
                    **asdict(opts.schedule), "api_key_set": opts.api_key is not None},
        "selection": _selection(sched),
        "engine": _engine_figures(info, opts),
        "vocab": {"size": vocab_size, "source": vocab_source},
    }
    if routing is not None:
        summary.update(servers=[public_url(u) for u in urls], fleet=routing.summary())
    return ReplayPlan(urls, infos, sched, routing, prompt_of, summary)


def _dispatch(run: RunDir, opts: ReplayOptions, plan: ReplayPlan, out_dir: Path, replacing: bool,
              on_start: Callable[[Schedule, ServerInfo], None] | None,
              on_update: Callable[[DispatchState], None] | None) -> ReplayResult:
    """Write the replay's folder (the old one cleared), send PLAN's requests, and finalize the summary however
    the dispatch ends (complete, interrupted or failed)."""
    info, routing, summary = plan.infos[0], plan.routing, plan.summary
    if replacing:  # the new replay is written aside and replaces the old one once finished (or stopped)
        work_dir = staging_dir(run.path)
    else:  # written in place: a replay killed hard keeps its records (summary "running")
        work_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
    if routing is not None:
        write_parquet_atomic(routing.table, work_dir / "routing.parquet")
    run.write_artifact(work_dir / "summary.json", summary)
    if on_start is not None:
        on_start(plan.sched, info)
    stats_path = _plugin_stats_path(info.url, opts.plugin_stats) if routing is None else opts.plugin_stats
    stats_before = read_stats(stats_path) if stats_path else None
    summary["plugin_stats_path"] = str(stats_path) if stats_path else None
    state = DispatchState(num_scheduled=len(plan.sched.requests))
    dopts = DispatchOptions(model=info.model, api_key=opts.api_key, max_in_flight=opts.max_in_flight,
                            closed_sessions=opts.schedule.closed_sessions,
                            request_timeout_s=opts.request_timeout_s, max_retries=opts.max_retries)
    writer = RecordWriter(work_dir / "records.jsonl")
    t_start = time.monotonic()
    status, error = "complete", None
    try:
        with stop_signals_interrupt():
            asyncio.run(dispatch(plan.urls, plan.sched.requests, plan.prompt_of, dopts, writer, state, on_update,
                                 routing.instance_of() if routing is not None else None))
    except KeyboardInterrupt as e:
        status, error = "interrupted", (str(e) or None)
    except Exception as e:
        status, error = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        writer.close()
        _finalize(run, work_dir, plan.infos, opts, summary, status, error, time.monotonic() - t_start,
                  stats_path, stats_before)
        _publish(run, work_dir, out_dir, summary)
    return ReplayResult(out_dir, summary)


def _publish(run: RunDir, work_dir: Path, out_dir: Path, summary: dict[str, Any]) -> None:
    """Put the finished replay in WORK_DIR in place as OUT_DIR (a replay written aside replaces the old one in one
    commit, artifact_set.commit_sets: killed before, the old replay stays whole) and its cost model as the run's
    latest (RUN/replay/cost_model.json, in the same commit)."""
    cost = summary.get("cost_model")
    latest = run.subdir("replay")
    if work_dir == out_dir:
        if cost is not None:
            run.write_artifact(latest / "cost_model.json", {**cost, "replay": out_dir.name})
        return
    files = []
    if cost is not None:
        cost_dir = staging_dir(run.path)
        run.write_artifact(cost_dir / "cost_model.json", {**cost, "replay": out_dir.name})
        files.append((cost_dir, latest, "cost_model.json"))
    commit_sets(run.path, [(work_dir, out_dir)], "replay", run.provenance().get("run_id"), files=files)


def _engine_figures(info: ServerInfo, opts: ReplayOptions) -> dict[str, Any]:
    """The engine's length limit and cache shape (the options win over what /metrics says)."""
    return {"max_model_len": info.max_model_len,
            "block_size": opts.engine_block_size or (info.metrics.block_size if info.metrics else None),
            "num_gpu_blocks": opts.engine_num_blocks or (info.metrics.num_gpu_blocks if info.metrics else None),
            "cache_config": info.metrics.cache_info if info.metrics else {}}


def _block_keys(run: RunDir, sched: Schedule, block_sizes: set[int | None]) -> dict[int, tuple[np.ndarray, int]]:
    """Each scheduled request's kv_block_keys and the prompt tokens its full engine blocks cover
    (sim.engine_model.engine_block_ids), when every server has one known block size; else none (the
    plugin's guard then samples vLLM's block hashes, and prompts are the trace's tokens throughout)."""
    from tongyi_trace.sim.engine_model import engine_block_ids

    bs = next(iter(block_sizes)) if len(block_sizes) == 1 else None
    if bs is None:
        return {}
    req_idx = np.array([r.req_idx for r in sched.requests], np.int64)
    ids, unique_from = engine_block_ids(run.tables(), req_idx, bs,
                                        np.array([r.max_tokens for r in sched.requests], np.int64))
    return {int(r): (k, int(u)) for r, k, u in zip(req_idx.tolist(), ids, unique_from, strict=True)}


def _fleet_routing(run: RunDir, sched: Schedule, infos: list[ServerInfo],
                   opts: ReplayOptions) -> FleetRouting:
    """The fleet router's instance for every scheduled request (replay/fleet.py)."""
    from tongyi_trace.replay.fleet import engine_shape_of, route_requests

    shapes = [(i.url, e["block_size"], e["num_gpu_blocks"]) for i in infos for e in [_engine_figures(i, opts)]]
    bs, nb = engine_shape_of(shapes)
    assert opts.router is not None
    return route_requests(run, [r.req_idx for r in sched.requests], [r.max_tokens for r in sched.requests],
                          opts.router, len(infos), bs, nb)


def reconcile_only(run_dir: str | Path, name: str) -> ReplayResult:
    """Rebuild an existing replay's summary figures and reconciliation from its records alone (after a
    simulator fix, or a replay stopped hard); engine-side figures already in summary.json are kept."""
    run = open_run(run_dir)
    with run.lock():
        return _reconcile_only(run, name)


def _reconcile_only(run: RunDir, name: str) -> ReplayResult:
    out_dir = run.path / "replay" / name
    summary_path = out_dir / "summary.json"
    records_path = out_dir / "records.jsonl"
    if not records_path.is_file():
        raise InputError(f"{records_path}: no such file; run 'kvtrace replay {run.path} --server URL "
                         f"--name {name}' first")
    summary = run.read_artifact(summary_path, REPLAY_SCHEMA, required=False) or {
        "schema": REPLAY_SCHEMA, "name": name, "status": "interrupted", "engine": {}, "selection": {}}
    if summary.get("status") in (None, "running"):
        summary["status"] = "interrupted"  # the replay process stopped before it could say so
        summary["error"] = summary.get("error") or "stopped before its summary was finished; rebuilt from records"
    recs = read_records(records_path)
    engine = summary.get("engine") if isinstance(summary.get("engine"), dict) else {}
    summary.update(_record_figures(recs, _num_scheduled(summary)))
    summary.setdefault("metrics", _no_metrics())
    ok = recs.filter(pl.col("status") == "ok")
    plugin = summary.get("plugin") if isinstance(summary.get("plugin"), dict) else None
    summary["reconciliation"], summary["reconciliation_note"] = _reconcile(run, out_dir, ok, engine or {},
                                                                          summary.get("servers"), plugin)
    run.write_artifact(summary_path, summary)
    return ReplayResult(out_dir, summary)


def _num_scheduled(summary: dict[str, Any]) -> int | None:
    sel = summary.get("selection")
    n = sel.get("num_scheduled") if isinstance(sel, dict) else None
    return n if isinstance(n, int) else None


def _no_metrics() -> dict[str, Any]:
    return {"before": None, "after": None, "hit_ratio": None, "hit_tokens": 0.0, "query_tokens": 0.0}


def _plugin_stats_path(url: str, given: Path | None) -> Path | None:
    """plugin_stats.json of the engine: --plugin-stats, else the local kvtrace engine serving URL."""
    if given is not None:
        return given
    st = local_engine_at(url)
    return Path(st.stats_dir) / STATS_FILE if st is not None and st.stats_dir else None


def _plugin_window(path: Path | None, before: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plugin's counters over the replay (read once the plugin has written its last changes)."""
    if path is None:
        return None
    after = read_settled_stats(path)
    return stats_delta(before, after) if after is not None else None


def _record_figures(recs: pl.DataFrame, num_scheduled: int | None) -> dict[str, Any]:
    """Every summary figure that follows from the records alone."""
    ok = recs.filter(pl.col("status") == "ok")
    failed = recs.filter(pl.col("status") == "error")
    num_cancelled = recs.height - ok.height - failed.height
    hits = records_hit_ratio(ok)
    retries = recs["retries"].fill_null(0)
    return {
        "counts": {"num_done": recs.height - num_cancelled, "num_ok": ok.height, "num_error": failed.height,
                   "num_cancelled": num_cancelled,
                   "num_not_finished": None if num_scheduled is None else num_scheduled - recs.height + num_cancelled},
        "retries": {"num_requests": int((retries > 0).sum()), "num_retries": int(retries.sum()),
                    "wait_s": float(recs["retry_wait_ms"].fill_null(0.0).sum()) / 1e3},
        "records_hit_ratio": hits.hit_ratio,
        "num_without_cached_tokens": hits.num_without_cached_tokens,
        "prompt_tokens_ok": int(ok["prompt_tokens"].sum() or 0),
        "num_cached_over_prompt": int((ok["cached_tokens"] > ok["prompt_tokens"]).sum() or 0),
        "cached_tokens_reported": hits.num_without_cached_tokens == 0,
        "drift_ms": _pcts(recs["drift_ms"]),
        "held_ms": _pcts(recs["held_ms"]),
        "ttft_ms": _pcts(ok["ttft_ms"]),
        "e2e_ms": _pcts(ok["e2e_ms"]),
        "tpot_ms": _pcts(ok["tpot_ms"]),
        "itl_ms": _pcts(ok["itl_ms"].explode()) if ok.height else _pcts(ok["tpot_ms"]),
        "throughput": _throughput(ok),
        "errors": (failed.group_by("error").len()
                   .sort(["len", "error"], descending=[True, False]).head(10).rename({"len": "count"})
                   .to_dicts()),
    }


def _throughput(ok: pl.DataFrame) -> dict[str, float | None]:
    """Requests and tokens per second over the span from the first send to the last completion (ok requests)."""
    done = ok.filter(pl.col("e2e_ms").is_not_null())
    span = (float((done["sent_s"] + done["e2e_ms"] / 1e3).max()) - float(done["sent_s"].min())  # type: ignore[arg-type]
            if done.height else 0.0)
    if span <= 0:
        return {"span_s": None, "requests_per_s": None, "output_tokens_per_s": None, "total_tokens_per_s": None}
    out = int(done["output_tokens"].sum() or 0)
    return {"span_s": span, "requests_per_s": done.height / span, "output_tokens_per_s": out / span,
            "total_tokens_per_s": (out + int(done["prompt_tokens"].sum() or 0)) / span}


def _finalize(run: RunDir, out_dir: Path, infos: list[ServerInfo], opts: ReplayOptions, summary: dict[str, Any],
              status: str, error: str | None, wall_s: float, stats_path: Path | None,
              stats_before: dict[str, Any] | None) -> None:
    """Write summary.json after the dispatch, whatever stopped it: first the figures of the records (a
    consistent summary even if the next step is interrupted; still "running" when the replay is to be
    complete, so that a kill before the engine side is never read as a complete replay), then the engine side
    (/metrics, cost fit, reconciliation, plugin counters). A stop during the engine side leaves the first
    summary, marked."""
    recs = read_records(out_dir / "records.jsonl")
    summary.update({"status": status, "error": error, "finished_at": time.time(), "wall_s": wall_s,
                    "metrics": _no_metrics(), "cost_model": None, "reconciliation": None,
                    "reconciliation_note": "not computed: the replay stopped first; run --reconcile-only",
                    "plugin": None, **_record_figures(recs, summary["selection"]["num_scheduled"])})
    counts = summary["counts"]
    if status == "complete" and counts["num_done"] and not counts["num_ok"]:  # nothing measured: no success
        top = summary["errors"][0]["error"] if summary["errors"] else "unknown error"
        summary["status"], summary["error"] = "failed", (f"every request failed ({counts['num_error']} of "
                                                         f"{counts['num_done']}; most often: {top})")
    final = summary["status"]
    run.write_artifact(out_dir / "summary.json", {**summary, "status": "running" if final == "complete" else final})
    try:
        with stop_signals_interrupt():
            summary["plugin"] = _plugin_window(stats_path, stats_before)  # first: the reconciliation simulates it
            summary.update(_engine_side(run, out_dir, infos, opts, recs, summary))
    except KeyboardInterrupt:
        summary["status"] = "interrupted"
        summary["error"] = summary["error"] or "stopped while reading the engine's final figures"
    run.write_artifact(out_dir / "summary.json", summary)


def _engine_side(run: RunDir, out_dir: Path, infos: list[ServerInfo], opts: ReplayOptions, recs: pl.DataFrame,
                 summary: dict[str, Any]) -> dict[str, Any]:
    """The summary figures that need the servers or the simulator: /metrics delta (summed over the servers
    of a fleet replay, each in metrics.per_server), cost fit, reconciliation."""
    per_server = [_metrics_delta(info, scrape_metrics(info.url, opts.api_key)) for info in infos]
    ok = recs.filter(pl.col("status") == "ok")
    metrics = per_server[0]
    if len(per_server) > 1:
        hit_tok, query_tok = (sum(m[k] for m in per_server) for k in ("hit_tokens", "query_tokens"))
        known = all(m["hit_ratio"] is not None for m in per_server) and query_tok > 0
        metrics = {"before": None, "after": None, "hit_ratio": hit_tok / query_tok if known else None,
                   "hit_tokens": hit_tok, "query_tokens": query_tok,
                   "per_server": [{"server": public_url(i.url), **m} for i, m in zip(infos, per_server, strict=True)]}
    out: dict[str, Any] = {"metrics": metrics}
    cost = fit_ttft_cost(ok)
    out["cost_model"] = cost
    if cost is not None:  # (the run's latest copy goes with the replay's commit: _publish)
        run.write_artifact(out_dir / "cost_model.json", cost)
    out["reconciliation"], out["reconciliation_note"] = _reconcile(run, out_dir, ok, summary["engine"],
                                                                   summary.get("servers"), summary.get("plugin"),
                                                                   name=opts.name)
    return out


def _metrics_delta(info: ServerInfo, after: MetricsSnapshot | None) -> dict[str, Any]:
    """The /metrics figures of one server over the replay."""
    hit_ratio, hit_tok, query_tok = (delta_hit_ratio(info.metrics, after) if info.metrics and after
                                     else (None, 0.0, 0.0))
    return {"before": _counters(info.metrics), "after": _counters(after), "hit_ratio": hit_ratio,
            "hit_tokens": hit_tok, "query_tokens": query_tok}


def _reconcile(run: RunDir, out_dir: Path, ok: pl.DataFrame, engine: dict[str, Any],
               servers: list[str] | None = None, plugin: dict[str, Any] | None = None, name: str | None = None,
               ) -> tuple[dict[str, Any] | None, str | None]:
    bs, nb = engine.get("block_size"), engine.get("num_gpu_blocks")
    if bs is None or nb is None:
        return None, ("the server exported no vllm:cache_config_info (block size, block count): pass "
                      "--engine-block-size and --engine-num-blocks")
    if ok.height == 0:
        return None, "no request completed"
    if ok["cached_tokens"].null_count():
        return None, ("the server reported no cached_tokens: start vLLM with --enable-prompt-tokens-details")
    try:
        if servers is not None and len(servers) > 1:
            from tongyi_trace.replay.fleet import reconcile_fleet

            routing = pl.read_parquet(out_dir / "routing.parquet")
            rec = reconcile_fleet(run, ok, routing, servers, int(bs), int(nb))
        else:
            rec = reconcile(run, ok, int(bs), int(nb), plugin=plugin)
    except ImportError as e:
        return None, f"simulator engine model unavailable ({e})"
    except KvtraceError as e:
        return None, f"simulator prediction failed: {e}"
    except Exception as e:  # a simulator bug must not lose the replay's summary: say it, keep the records
        return None, (f"simulator prediction crashed ({type(e).__name__}: {e}); once fixed, run "
                      f"'kvtrace replay {run.path} --name {name or out_dir.name} --reconcile-only'")
    write_parquet_atomic(rec.table, out_dir / "reconcile.parquet")
    return rec.aggregate, None

"""`kvtrace replay RUN --server URL1,URL2,... --router R`: replay across several real engines, routed by the
fleet simulator's router code, reconciled per instance (docs/artifacts/replay.md, "Several servers").

Routing. Before the first send, the scheduled requests (in send order) are served by the fleet simulator
(fleet/simulate.py) with each instance modelled as the engines are: the engines' block size and block
count, vLLM's LRU, its last-token and output-block rules (sim/engine_model.py). The router (routers/)
chooses each request's instance at its arrival from what the simulator gives every router: each
instance's queued prefill work under the cost model and the requests routed so far, the conversation,
the router's own index of what it routed (`prefix`: exactly the simulator's), and each instance's cached
prefix of the request (`kv-aware`, `oracle-affinity`: the model's caches, standing in for the engines'
KV events). All of it depends only on earlier requests, so routing every request up front routes each
at its arrival; the replay then sends each request to its instance's server. routing.parquet keeps, per
scheduled request, the instance and the fleet simulator's predicted engine hit.

Reconciliation. Per instance, the requests it completed (in send order) are reconciled as a single-server
replay is (replay/reconcile.py: ideal, LRU at the engine's block count, engine cached_tokens); the tables
are joined with the instance and the fleet simulator's prediction made before the replay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from tongyi_trace.errors import UsageError
from tongyi_trace.fleet.routers import get_router
from tongyi_trace.fleet.simulate import simulate_fleet
from tongyi_trace.fleet.sweep import run_sessions
from tongyi_trace.models import DEFAULT_MODEL
from tongyi_trace.replay.reconcile import Reconciliation, aggregate_reconciliation, reconcile
from tongyi_trace.run import RunDir
from tongyi_trace.sim.cost_model import CostModel, preset_cost
from tongyi_trace.sim.engine_model import engine_case

ROUTING_SCHEMA: dict[str, type[pl.DataType]] = {
    "order": pl.Int64, "req_idx": pl.Int64, "instance": pl.Int64, "fleet_predicted_hit_tokens": pl.Int64,
}


def parse_servers(server: str, router: str | None) -> list[str]:
    """'URL' or 'URL1,URL2,...' -> the URLs; several need a router, one takes none."""
    urls = [u.strip().rstrip("/") for u in server.split(",") if u.strip()]
    if not urls:
        raise UsageError("--server is empty; give a URL such as http://127.0.0.1:8000")
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise UsageError(f"--server lists {dup[0]} twice; give each engine once")
    if len(urls) > 1 and router is None:
        raise UsageError(f"--server gives {len(urls)} engines: choose how requests are routed with --router, "
                         "e.g. --router prefix (rr, least-loaded, session, prefix, kv-aware, oracle-affinity)")
    if len(urls) == 1 and router is not None:
        raise UsageError("--router routes across several engines: give them as --server URL1,URL2,...")
    if router is not None:
        get_router(router)
    return urls


def engine_shape_of(engines: list[tuple[str, int | None, int | None]]) -> tuple[int, int]:
    """(block size, blocks) the engines share, from (url, block size, blocks) of each; the fleet simulator
    models identical instances, so engines that differ (or do not say) are refused."""
    known = {(bs, nb) for _, bs, nb in engines}
    if len(known) > 1:
        sizes = "; ".join(f"{url}: block size {bs}, {nb} blocks" for url, bs, nb in engines)
        raise UsageError(f"the engines differ ({sizes}): a fleet replay needs engines started alike "
                         "(kvtrace engine start --num-blocks N --block-size B for each)")
    bs, nb = known.pop()
    if bs is None or nb is None:
        raise UsageError("the engines export no vllm:cache_config_info (block size, block count), which the "
                         "router's model of each engine needs: pass --engine-block-size and --engine-num-blocks")
    return int(bs), int(nb)


def routing_cost() -> CostModel:
    """The cost model of the routers' queue estimate: `kvtrace simulate`'s default model's."""
    return preset_cost(DEFAULT_MODEL)


@dataclass(frozen=True)
class FleetRouting:
    """The instance of each scheduled request and the fleet simulator's prediction of its engine hit."""

    router: str
    num_instances: int
    table: pl.DataFrame  # ROUTING_SCHEMA, one row per scheduled request in send order
    cost: CostModel

    def instance_of(self) -> dict[int, int]:
        """req_idx -> instance."""
        return dict(zip(self.table["req_idx"].to_list(), self.table["instance"].to_list(), strict=True))

    def summary(self) -> dict[str, Any]:
        """The `fleet` block of summary.json before the replay (routing side)."""
        inst = self.table["instance"].to_numpy()
        hit = self.table["fleet_predicted_hit_tokens"].to_numpy()
        return {"router": self.router, "num_instances": self.num_instances, "cost_model": asdict(self.cost),
                "routed_per_instance": np.bincount(inst, minlength=self.num_instances).tolist(),
                "fleet_predicted_hit_tokens": int(hit.sum())}


def route_requests(run: RunDir, req_idx: list[int], output_tokens: list[int], router: str, num_instances: int,
                   engine_block_size: int, num_engine_blocks: int) -> FleetRouting:
    """Route the requests REQ_IDX (send order; OUTPUT_TOKENS generated each) over NUM_INSTANCES engines of
    NUM_ENGINE_BLOCKS blocks of ENGINE_BLOCK_SIZE tokens with ROUTER, by the fleet simulator."""
    sel = np.asarray(req_idx, np.int64)
    full, shape, capacity = engine_case(run.tables(), sel, engine_block_size, num_engine_blocks,
                                        output_tokens=np.asarray(output_tokens, np.int64))
    session, _ = run_sessions(run.tables(), full)
    cost = routing_cost()
    res = simulate_fleet(full, router, num_instances, "lru", capacity, engine=shape, cost=cost, session=session)
    table = pl.DataFrame({"order": np.arange(sel.size, dtype=np.int64), "req_idx": sel,
                          "instance": res.req_instance, "fleet_predicted_hit_tokens": res.req_hit_tokens},
                         schema=ROUTING_SCHEMA)
    return FleetRouting(res.router, num_instances, table, cost)


def reconcile_fleet(run: RunDir, ok_records: pl.DataFrame, routing: pl.DataFrame, urls: list[str],
                    engine_block_size: int, num_gpu_blocks: int, num_worst: int = 20) -> Reconciliation:
    """Reconcile OK_RECORDS (status ok, with their instance) per instance, joined with ROUTING (the fleet
    simulator's instance and prediction per request); aggregates overall and per instance."""
    parts = []
    for i in range(len(urls)):
        recs = ok_records.filter(pl.col("instance") == i)
        if recs.height:
            parts.append(reconcile(run, recs, engine_block_size, num_gpu_blocks).table
                         .with_columns(pl.lit(i, pl.Int64).alias("instance")))
    if not parts:
        return Reconciliation(pl.DataFrame(), {"num_requests": 0, "prompt_tokens": 0})
    sent = ok_records.select("req_idx", "sent_s")
    table = (pl.concat(parts).drop("order").join(sent, on="req_idx").sort("sent_s").drop("sent_s")
             .join(routing.select("req_idx", pl.col("instance").alias("routed_instance"),
                                  "fleet_predicted_hit_tokens"), on="req_idx", how="left")
             .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("order")))
    table = table.select("order", *[c for c in table.columns if c != "order"])
    agg = aggregate_reconciliation(table.drop("instance", "routed_instance", "fleet_predicted_hit_tokens"),
                                   num_worst)
    fleet_pred = table["fleet_predicted_hit_tokens"].to_numpy()
    agg["fleet_predicted_hit_ratio"] = (float(fleet_pred.sum()) / agg["prompt_tokens"]
                                        if agg["prompt_tokens"] else None)
    agg["fleet_exact_share"] = float(np.mean(fleet_pred == table["engine_cached_tokens"].to_numpy()))
    agg["num_off_route"] = int((table["instance"] != table["routed_instance"]).sum())
    routed = routing["instance"].to_numpy()
    agg["per_instance"] = [_instance_figures(i, url, table.filter(pl.col("instance") == i),
                                             int((routed == i).sum())) for i, url in enumerate(urls)]
    return Reconciliation(table, agg)


def _instance_figures(i: int, url: str, t: pl.DataFrame, num_routed: int) -> dict[str, Any]:
    prompt = int(t["prompt_tokens"].sum() or 0)

    def ratio(col: str) -> float | None:
        return float(t[col].to_numpy().sum()) / prompt if prompt else None

    return {"instance": i, "server": url, "num_routed": num_routed, "num_ok": t.height, "prompt_tokens": prompt,
            "engine_hit_ratio": ratio("engine_cached_tokens"), "predicted_hit_ratio": ratio("predicted_hit_tokens"),
            "fleet_predicted_hit_ratio": ratio("fleet_predicted_hit_tokens"),
            "ideal_hit_ratio": ratio("ideal_hit_tokens"),
            "exact_share": float(np.mean(t["engine_minus_predicted"].to_numpy() == 0)) if t.height else None}

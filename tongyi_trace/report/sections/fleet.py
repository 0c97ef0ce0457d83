"""Section: the fleet (`kvtrace simulate --instances --router`): hit ratio and P99 QTTFT over routers x
instance counts, and what stickiness costs in load balance (imbalance) and buys against duplication.
Artifacts in RUN_DIR/sim/fleet/: summary.json, results.parquet (or results.jsonl while the sweep runs);
see docs/fleet.md."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.artifacts import read_results, read_versioned
from tongyi_trace.report.figures import Fig, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.schemas import FLEET_SCHEMA

REMEDY = "re-run 'kvtrace simulate RUN_DIR --instances ...'"
COLUMNS = ["router", "num_instances", "policy", "capacity", "capacity_blocks", "hit_ratio", "hbm_hit_ratio",
           "dram_hit_ratio", "remote_hit_ratio", "qttft_mean_s", "qttft_p99_s", "imbalance", "duplication"]


def build(run: RunDir) -> list[Section]:
    """The fleet section, or nothing when no fleet sweep was run."""
    d = run.path / "sim" / "fleet"
    res = _results(d)
    if res is None:
        return []
    summary = read_versioned(d / "summary.json", FLEET_SCHEMA, REMEDY) or {}
    s = Section(key="fleet", title="The fleet: routers x instances (kvtrace simulate --instances)",
                definition="N instances behind a router, each with its own prefix cache of the given capacity (HBM, "
                           "plus CPU DRAM with --hbm-capacity) under the same eviction policy and its own FIFO "
                           "prefill queue (QTTFT cost model). Imbalance = max / mean utilization of the instances; "
                           "duplication = share of cached blocks held by two or more instances.")
    policy = str(res["policy"][0])
    res = res.filter(pl.col("policy") == policy)
    caps = res.select("capacity", "capacity_blocks").unique(maintain_order=True).sort("capacity_blocks")["capacity"]
    routers = res["router"].unique(maintain_order=True).to_list()
    counts = sorted(res["num_instances"].unique().to_list())
    s.figures["hit"] = _figure(res, "hit_ratio", "hit ratio", log=False)
    s.figures["p99"] = _figure(res, "qttft_p99_s", "P99 QTTFT (s, log)", log=True)
    cell = {(r["router"], r["num_instances"], r["capacity"]): r for r in res.iter_rows(named=True)}
    cols = ["router", "capacity", *[f"{n} inst: hit / P99" for n in counts]]
    s.tables["grid"] = Table(columns=cols, rows=[
        [rt, cap, *[_cell(cell.get((rt, n, cap))) for n in counts]] for cap in caps for rt in routers],
        caption=f"Policy {policy}; capacity per instance.")
    s.tables["balance"] = Table(
        columns=["router", "capacity", *[f"{n} inst: imbalance / duplication" for n in counts]],
        rows=[[rt, cap, *[_balance(cell.get((rt, n, cap))) for n in counts]] for cap in caps for rt in routers])
    deployable = res.filter(pl.col("router") != "oracle-affinity")
    best = deployable.sort(["qttft_p99_s", "hit_ratio"], descending=[False, True]).row(0, named=True)
    s.values = {"policy": policy, "ideal": fmt.ratio(summary.get("ideal_hit_ratio")),
                "best_router": best["router"], "best_instances": best["num_instances"],
                "best_capacity": best["capacity"], "best_p99": fmt.seconds(best["qttft_p99_s"]),
                "best_hit": fmt.ratio(best["hit_ratio"]), "sessions": str(summary.get("session_source") or ""),
                "partial": not (d / "results.parquet").is_file()}
    s.headline = [Headline("fleet: lowest P99 QTTFT (router x instances @ capacity per instance)",
                           f"{best['router']} x {best['num_instances']} @ {best['capacity']}: "
                           f"{fmt.seconds(best['qttft_p99_s'])}, hit {fmt.ratio(best['hit_ratio'])}")]
    return [s]


def _cell(r: dict | None) -> str:
    return f"{fmt.ratio(r['hit_ratio'])} / {fmt.seconds(r['qttft_p99_s'])}" if r else "-"


def _balance(r: dict | None) -> str:
    return f"{fmt.num(r['imbalance'], 2)} / {fmt.pct(r['duplication'])}" if r else "-"


def _figure(res: pl.DataFrame, col: str, title: str, *, log: bool) -> Fig:
    fig = new_figure(x_title="instances", y_title=title)
    if log:
        fig.update_yaxes(type="log")
    for (rt, cap), g in res.sort("num_instances").group_by(["router", "capacity"], maintain_order=True):
        fig.add_scatter(x=g["num_instances"].to_list(), y=g[col].to_list(), mode="lines+markers",
                        name=f"{rt} @ {cap}", line={"dash": "dot"} if rt == "oracle-affinity" else {})
    return fig


def _results(d: Path) -> pl.DataFrame | None:
    """The fleet sweep's rows so far (report.artifacts.read_results)."""
    return read_results(d, COLUMNS, [], "fleet", REMEDY)



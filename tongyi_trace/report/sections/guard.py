"""Section: the shadow-LRU guard and the online refit of WA in the simulator, per guarded run (policy x
capacity) in which the guard switched or the refit ran (the guard is on for every WA row; a run where it
never acted is the bare policy's, and its guard column in the simulate table says so; the ablation's
variants, whose guard acts as WA's, get none): a time line of the cache's hit ratio on the sampled
references against the two shadows' (policy and LRU), the guard's mode and the refits, and a table of the
switches with both estimates (tongyi_trace.policy.guard). Artifacts in RUN_DIR/sim/: guard_timeline.parquet,
guard_switches.parquet, guard_refits.parquet (written by `kvtrace simulate` for WA rows: the guard is on
by default)."""

from __future__ import annotations

import polars as pl

from tongyi_trace.report import fmt
from tongyi_trace.report.artifacts import read_parquet
from tongyi_trace.report.figures import downsample, label, new_figure
from tongyi_trace.report.model import Headline, Section, Table
from tongyi_trace.run import RunDir
from tongyi_trace.sim.guarded import lru_time_share
from tongyi_trace.sim.recommend import report_sweep
from tongyi_trace.sim.registry import WA_ABLATION

REMEDY = "re-run 'kvtrace simulate RUN_DIR -p wa'"
MAX_SECTIONS = 1  # guard sections shown: the run where it switched and refitted most
SMOOTH_SLICES = 12  # rolling mean over this many slices in the figure (2 minutes of 10-s slices)


def build(run: RunDir) -> list[Section]:
    """One section per guarded run in which the guard switched or the refit ran (the MAX_SECTIONS where it
    acted most, in report order); nothing when none did."""
    sweep = report_sweep(run.path)
    if sweep is None:
        return []
    d = sweep.path
    tl = read_parquet(d / "guard_timeline.parquet", REMEDY)
    if tl is None or tl.height == 0:
        return []
    switches = read_parquet(d / "guard_switches.parquet", REMEDY)
    refits = read_parquet(d / "guard_refits.parquet", REMEDY)
    results = read_parquet(d / "results.parquet", REMEDY)
    out = []
    for (policy, capacity), part in tl.sort("time_s").group_by(["policy", "capacity"], maintain_order=True):
        if policy in WA_ABLATION or not (part["switched"].any() or part["refit"].any()):
            continue
        key = f"guard-{policy}-{capacity}".replace(".", "_").replace("%", "pct")
        s = Section(key=key, partial="guard", title=f"Guard and refit: {policy} at {capacity}",
                    definition="Shadows: two caches of sample_rate x the capacity (at least 512 blocks) over the "
                               "blocks sampled by a hash (SHARDS), one in LRU order, one under the policy. The "
                               "guard compares the order that runs (measured on the cache's own hits on the "
                               "sampled references) with the other order's shadow, and switches when the other "
                               "order's lead since the running one last led, in points x seconds, reaches "
                               "guard_margin x guard_window_s (four times that to return) and two standard errors.")
        t_min = part["time_s"].to_numpy() / 60.0
        fig = new_figure(x_title="time (min from trace start)", y_title="hit ratio on sampled refs (rolling)")
        for col, name in (("sampled_hit_ratio", "cache"), ("shadow_policy_hit_ratio", "policy shadow"),
                          ("shadow_lru_hit_ratio", "LRU shadow")):
            y = part[col].fill_nan(None).rolling_mean(SMOOTH_SLICES, min_samples=1).to_numpy()
            x, yy = downsample(t_min, y)
            fig.add_scatter(x=x, y=yy, mode="lines", name=label(name))
        lru = part.filter(pl.col("guard_mode") == "lru")
        if lru.height:
            fig.add_scatter(x=lru["time_s"].to_numpy() / 60.0, y=[0.0] * lru.height, mode="markers",
                            name="guard in LRU order", marker={"symbol": "line-ns-open", "size": 8})
        refit_t = part.filter(pl.col("refit"))["time_s"].to_numpy() / 60.0
        if refit_t.size:
            fig.add_scatter(x=refit_t, y=[1.0] * refit_t.size, mode="markers", name="refit",
                            marker={"symbol": "triangle-down", "size": 8})
        s.figures["timeline"] = fig
        sw = switches.filter((pl.col("policy") == policy) & (pl.col("capacity") == capacity)) \
            if switches is not None else pl.DataFrame()
        s.tables["switches"] = Table(
            columns=["time", "to", "policy (window)", "LRU (window)"],
            rows=[[fmt.seconds(r["time_s"]), r["to_mode"], fmt.ratio(r["policy_hit_ratio"]),
                   fmt.ratio(r["lru_hit_ratio"])] for r in sw.iter_rows(named=True)],
            caption="Every switch of the guard with the two windowed estimates that decided it.")
        rf = refits.filter((pl.col("policy") == policy) & (pl.col("capacity") == capacity)) \
            if refits is not None else pl.DataFrame()
        changed = rf.filter(pl.col("refitted")) if rf.height else rf
        s.tables["refits"] = Table(
            columns=["time", "category", "samples", "KS before", "p before", "p after"],
            rows=[[fmt.seconds(r["time_s"]), label(r["category"]), fmt.count(r["num_samples"]), fmt.num(r["ks"]),
                   fmt.num(r["old_reuse_prob"]), fmt.num(r["new_reuse_prob"])]
                  for r in changed.iter_rows(named=True)],
            caption="Categories refitted (their window's KS distance to the running model was too large).")
        num_refits = int(part["refit"].cast(pl.Int64).sum())
        s.values = {"switches": times(sw.height), "refits": times(num_refits),
                    "lru_share": fmt.pct(lru_share(results, str(policy), str(capacity), part)),
                    "num_refitted": fmt.count(changed.height)}
        s.headline = [Headline(f"guard switches ({policy} @ {capacity})", s.values["switches"])]
        out.append(s)
    # the runs where the guard acted most; the simulator section's guard table lists every guarded run
    keep = sorted(range(len(out)), key=lambda i: -_acted(out[i]))[:MAX_SECTIONS]
    return [out[i] for i in sorted(keep)]


def _acted(s: Section) -> int:
    """How often the guard of section S switched plus how often its refit ran."""
    return sum(int(str(s.values[k]).split()[0].replace(",", "")) for k in ("switches", "refits"))


def times(n: int) -> str:
    """'1 time', '3 times'."""
    return f"{fmt.count(n)} time{'' if n == 1 else 's'}"


def lru_share(results: pl.DataFrame | None, policy: str, capacity: str, timeline: pl.DataFrame) -> float:
    """The share of the trace the guard kept POLICY at CAPACITY in LRU order: the sweep row's
    guard_time_lru_s over the guarded time (the one source the simulate table also shows), else the share
    of the timeline's slices in LRU mode."""
    if results is not None and "guard_time_lru_s" in results.columns:
        rows = results.filter((pl.col("policy") == policy) & (pl.col("capacity") == capacity)).to_dicts()
        share = lru_time_share(rows[0]) if rows else None
        if share is not None:
            return share
    return float((timeline["guard_mode"] == "lru").cast(pl.Float64).mean() or 0.0)  # type: ignore[arg-type]

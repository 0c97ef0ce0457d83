"""`kvtrace synth --like RUN --check`: the twin of a run measured against the run, figure by figure.

The twin is drawn (fit/synth_like.py), written, ingested (`kvtrace ingest`), characterized
(`kvtrace analyze`'s hit_ratio and reuse_time) and replayed through the exact LRU curve of the
simulator (tongyi_trace.sim.lru_curve), exactly as the run is; nothing is recomputed here. Tolerances
(issue 38 item 4): ideal hit ratio +-0.02; prefix-LRU hit ratio +-0.03 at 1, 5, 10 and 25% of each
trace's own distinct blocks; Kolmogorov-Smirnov distance <= 0.10 between the reuse-time CDFs (the
reuse_time analysis's, on its log bins) and <= 0.05 between the arrival times (the request rate over
time), the input lengths and the output lengths.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy.stats import ks_2samp

from tongyi_trace.analysis.runner import run_analyses
from tongyi_trace.errors import UsageError
from tongyi_trace.fit.synth_like import synth_like_to_file
from tongyi_trace.fit.synth_twin import IDEAL_TOL, LRU_POINTS, LRU_TOL, REUSE_KS_MAX
from tongyi_trace.run import RunDir, open_run
from tongyi_trace.schemas import ALL_CATEGORIES
from tongyi_trace.sim.capacity import parse_capacities
from tongyi_trace.sim.lru_curve import lru_curve
from tongyi_trace.sim.stream import load_stream
from tongyi_trace.trace.ingest import ingest_trace

SHAPE_KS_MAX = 0.05


@dataclass(frozen=True)
class TwinRow:
    """One figure: the run's value and the twin's (a KS row: the distance as the twin's value, no run
    value), the tolerance and the verdict."""

    key: str
    label: str
    run: float | None
    twin: float
    tolerance: str
    ok: bool

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON-ready dict."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Figures:
    """What the check compares, read from a run's analyses, its LRU curve and its requests."""

    ideal_hit: float
    lru: dict[str, float]
    reuse_cdf: dict[int, float]  # log bin -> share of reuses within it
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray


def measure(run: RunDir) -> Figures:
    """RUN's ideal hit ratio, LRU hit ratios at LRU_POINTS, reuse-time CDF and length and arrival samples."""
    report = run_analyses(run, only=["hit_ratio", "reuse_time"], write=False)
    cdf = report.results["reuse_time"].tables["cdf"].filter(pl.col("category") == ALL_CATEGORIES)
    stream = load_stream(run.tables())
    curve = lru_curve(stream)
    caps = parse_capacities(",".join(LRU_POINTS), num_distinct=stream.num_ids, block_size_tokens=stream.block_size,
                            model=None)
    req = run.requests()
    arrival = req["arrival_s"].to_numpy()
    return Figures(
        ideal_hit=float(report.results["hit_ratio"].headline["hit_ratio"]),
        lru={c.label: curve.hit_ratio(c.num_blocks) for c in caps},
        reuse_cdf=dict(zip(cdf["bin"].to_list(), cdf["share_of_reuses_within"].to_list(), strict=True)),
        arrival_s=arrival - arrival.min(), input_tokens=req["input_tokens"].to_numpy(),
        output_tokens=req["output_tokens"].to_numpy())


def cdf_distance(a: dict[int, float], b: dict[int, float]) -> float:
    """KS distance between two CDFs given per log bin (a bin one lacks: its value at the bin below)."""
    bins = sorted(set(a) | set(b))

    def steps(c: dict[int, float]) -> np.ndarray:
        return np.maximum.accumulate(np.asarray([c.get(x, 0.0) for x in bins], dtype=np.float64))

    return float(np.max(np.abs(steps(a) - steps(b)))) if bins else 0.0


def judge(run: Figures, twin: Figures) -> list[TwinRow]:
    """Every figure of the twin against the run's, with the issue's tolerances."""
    rows = [TwinRow("ideal_hit", "ideal hit ratio", run.ideal_hit, twin.ideal_hit, f"+-{IDEAL_TOL}",
                    abs(twin.ideal_hit - run.ideal_hit) <= IDEAL_TOL)]
    for p in LRU_POINTS:
        rows.append(TwinRow(f"lru_{p}", f"LRU hit at {p} of distinct blocks", run.lru[p], twin.lru[p],
                            f"+-{LRU_TOL}", abs(twin.lru[p] - run.lru[p]) <= LRU_TOL))
    ks = cdf_distance(run.reuse_cdf, twin.reuse_cdf)
    rows.append(TwinRow("ks_reuse_time", "reuse-time CDF, KS distance", None, ks, f"<= {REUSE_KS_MAX}",
                        ks <= REUSE_KS_MAX))
    for key, label, a, b in (("ks_arrival", "request rate over time, KS distance", run.arrival_s, twin.arrival_s),
                             ("ks_input", "input lengths, KS distance", run.input_tokens, twin.input_tokens),
                             ("ks_output", "output lengths, KS distance", run.output_tokens, twin.output_tokens)):
        d = float(ks_2samp(a, b).statistic)
        rows.append(TwinRow(key, label, None, d, f"<= {SHAPE_KS_MAX}", d <= SHAPE_KS_MAX))
    return rows


def check_twin(run_dir: str | Path, seed: int, work_dir: Path | None = None,
               run_figures: Figures | None = None) -> list[TwinRow]:
    """Draw the twin of the run RUN_DIR at SEED, ingest and measure both (RUN_FIGURES: the run's, when
    already measured), and judge every figure."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UsageError(f"{path}: --check compares the twin with its run: give --like a run folder "
                         "(from 'kvtrace ingest')")
    run = open_run(path)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        trace = Path(tmp) / "twin.jsonl"
        synth_like_to_file(path, seed, trace)
        ingest_trace(trace, Path(tmp) / "run", block_size=int(run.provenance()["block_size"]))
        return judge(run_figures or measure(run), measure(RunDir(Path(tmp) / "run")))

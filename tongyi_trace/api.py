"""The Python API for notebooks: the same steps as the `kvtrace` commands, returning Polars frames and dicts.

    import tongyi_trace as kv
    run = kv.ingest("trace.jsonl", "runs/t")          # or kv.open_run("runs/t")
    run.analyze(only=["hit_ratio"])                     # headline figures per analysis
    run.fit(capacities="5%")                            # writes RUN/fit/policy.json
    df = run.simulate(["lru", "wa"], "5%,40GiB")        # one row per policy x capacity
    curve = run.lru_curve()                             # the exact LRU hit ratio at every capacity

Errors are the project's (tongyi_trace.errors: UsageError, InputError...), each with a one-line message.
Documented in docs/api.md; the CLI commands call the same core functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tongyi_trace.models import PRESETS
from tongyi_trace.sim.registry import DEFAULT_CAPACITIES, DEFAULT_POLICIES  # light: names only (no numba)

if TYPE_CHECKING:
    import polars as pl

    from tongyi_trace.run import RunDir

__all__ = ["Run", "ingest", "open_run"]


@dataclass(frozen=True)
class Run:
    """One run folder (written by `ingest`): its tables and the pipeline's steps over it."""

    path: Path

    @property
    def _dir(self) -> RunDir:
        from tongyi_trace.run import open_run as _open

        return _open(self.path)

    @property
    def provenance(self) -> dict[str, Any]:
        """provenance.json: source file, sha256, format, block size, counts, ingest findings."""
        return self._dir.provenance()

    def requests(self) -> pl.DataFrame:
        """One row per request (requests.parquet; docs/architecture.md lists the columns)."""
        import polars as pl

        return pl.read_parquet(self._dir.requests_path)

    def blocks(self) -> pl.DataFrame:
        """One row per block reference (blocks.parquet)."""
        import polars as pl

        return pl.read_parquet(self._dir.blocks_path)

    def analyze(self, only: Sequence[str] | None = None,
                models: Sequence[str] = tuple(PRESETS)) -> dict[str, dict[str, Any]]:
        """Run the characterization analyses (all, or ONLY) and write RUN/analysis/; return each analysis's
        headline figures by name (absent analyses give {"status": "absent", "reason": ...})."""
        from tongyi_trace.analysis import AnalysisOptions, resolve_models, run_analyses

        rep = run_analyses(self._dir, only=list(only) if only is not None else None,
                           options=AnalysisOptions(models=resolve_models(list(models))))
        return {name: (r.headline if r.ok else {"status": r.status, "reason": r.reason})
                for name, r in rep.results.items()}

    def fit(self, capacities: str | None = "1L", *, model: str | None = None, train: str | None = None,
            test: str | None = None, jobs: int = 0) -> Path:
        """Fit the reuse model per category, choose the setting per capacity (None: no choice) and write
        RUN/fit/policy.json; return its path. MODEL: preset name or Hugging Face config.json path (default:
        the model the run was last sized with, else the default preset)."""
        from tongyi_trace.fit.policy_fit import fit_policy
        from tongyi_trace.models import remember_sizing, run_sizing

        sizing = run_sizing(self.path, model)
        out = fit_policy(self.path, self.path / "fit" / "policy.json", train=train, test=test,
                         capacities=capacities, model=sizing.preset(), jobs=jobs)
        remember_sizing(self.path, sizing, "fit")
        return out.policy_path

    def simulate(self, policies: Sequence[str] | str = DEFAULT_POLICIES,
                 capacities: Sequence[str] | str = DEFAULT_CAPACITIES, *, model: str | None = None,
                 params: str | Path | None = None, gpu_mem_gib: float | None = None, tp: int | None = None,
                 name: str | None = None, jobs: int = 0) -> pl.DataFrame:
        """Simulate POLICIES x CAPACITIES (as `kvtrace simulate -p/-c`: blocks, 5%, 0.5x, 2L, 40GiB, inf) and
        write RUN/sim/ (and RUN/sim/NAME/ when NAME is given); return one row per policy x capacity (hit
        ratios, evictions, QTTFT, utilization). `wa` and `fitted` use PARAMS, a policy file from `fit`
        (default RUN/fit/policy.json). MODEL (and GPU_MEM_GIB, TP) default to what the run was last sized
        with, else the default preset."""
        import polars as pl

        from tongyi_trace.sim.sweep import SimulateOptions, simulate_run

        pols = policies if isinstance(policies, str) else ",".join(policies)
        caps = capacities if isinstance(capacities, str) else ",".join(capacities)
        res = simulate_run(self.path, SimulateOptions(
            policies=pols, capacities=caps, model=model, gpu_mem_gib=gpu_mem_gib, tp=tp,
            params_path=Path(params) if params is not None else None, name=name, jobs=jobs))
        return pl.DataFrame([{k: v for k, v in r.items() if k not in ("per_category", "params")} for r in res.rows])

    def lru_curve(self) -> pl.DataFrame:
        """The exact LRU curve: hit_ratio and token_hit_ratio at every capacity_blocks where it rises."""
        import polars as pl

        from tongyi_trace.sim.lru_curve import lru_curve
        from tongyi_trace.sim.stream import load_stream

        return pl.DataFrame(lru_curve(load_stream(self._dir.tables())).steps())

    def recommend(self) -> dict[str, Any] | None:
        """The Recommendation of the run's pinned sweep (the one the report reads; schema
        kvtrace.recommendation/1), None before a sweep."""
        from tongyi_trace.sim.recommend import recommend_run

        return recommend_run(self.path)

    def recommendation_lines(self) -> list[str]:
        """The Recommendation in plain words, the lines `kvtrace simulate` and the report print ([] before a
        sweep)."""
        from tongyi_trace.sim.recommend import describe

        rec = self.recommend()
        return [] if rec is None else describe(rec)

    def report(self) -> Path:
        """Write RUN/report.html from the saved artifacts; return its path."""
        from tongyi_trace.report import render_report

        return render_report(self._dir)


def open_run(path: str | Path) -> Run:
    """Open an existing run folder (raises InputError saying how to make one)."""
    from tongyi_trace.run import open_run as _open

    return Run(_open(path).path.resolve())


def ingest(trace: str | Path, out: str | Path, *, overwrite: bool = False, block_size: int | None = None,
           fmt: str | None = None, infer_sessions: bool | None = None) -> Run:
    """Read TRACE (Bailian or Mooncake JSONL, .gz/.zst, or kvtrace Parquet) into the run folder OUT
    (INFER_SESSIONS: link sessions by prompt prefix; default on for Mooncake traces only)."""
    from tongyi_trace.trace.ingest import ingest_trace

    ingest_trace(trace, out, fmt=fmt, block_size=block_size, overwrite=overwrite, infer_sessions=infer_sessions)
    return open_run(out)

"""Characterization analyses of a KV-cache trace (paper "KVCache Cache in the Wild", section 3).

One module per analysis, each a typed function `NAME(ctx) -> AnalysisResult` over the DuckDB views of
a run folder; `run_analyses(run, only=...)` runs a set of them and writes RUN_DIR/analysis/.
"""

from tongyi_trace.analysis.common import AnalysisContext, AnalysisOptions, AnalysisResult, resolve_models
from tongyi_trace.analysis.runner import ANALYSES, AnalysisReport, parse_only, run_analyses

__all__ = ["ANALYSES", "AnalysisContext", "AnalysisOptions", "AnalysisReport", "AnalysisResult",
           "parse_only", "resolve_models", "run_analyses"]

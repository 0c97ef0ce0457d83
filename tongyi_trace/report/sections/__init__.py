"""Section builders, in report order. Each reads saved artifacts of a run folder and returns the
sections it can show (an empty list when its step was not run)."""

from __future__ import annotations

from collections.abc import Callable

from tongyi_trace.report.model import Section
from tongyi_trace.report.sections import (
    compare,
    fit,
    fleet,
    guard,
    hit_ratio,
    kv_size,
    lifespan,
    live_set,
    next_turn,
    provenance,
    recommendation,
    replay,
    request_mix,
    reuse_time,
    sim,
    skew,
    spatial,
    sweep,
    turn_hits,
    user_heatmap,
)
from tongyi_trace.run import RunDir

Builder = Callable[[RunDir], list[Section]]

BUILDERS: list[Builder] = [
    # the planner's answer first (from `kvtrace simulate`)
    recommendation.build,
    provenance.build,
    # characterization (`kvtrace analyze`), in the paper's figure order
    hit_ratio.build,
    request_mix.build,
    turn_hits.build,
    user_heatmap.build,
    skew.build,
    next_turn.build,
    reuse_time.build,
    spatial.build,
    lifespan.build,
    kv_size.build,
    live_set.build,
    # the reuse model (`kvtrace fit`)
    fit.build,
    # policies in the embedded simulator (`kvtrace simulate`)
    sim.build,
    fleet.build,
    guard.build,
    # live replays on vLLM (`kvtrace replay`), one section each
    replay.build,
    sweep.build,
    compare.build,
]

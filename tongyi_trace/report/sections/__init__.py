"""Section builders, in report order. Each reads saved artifacts of a run folder and returns the
sections it can show (an empty list when its step was not run)."""

from __future__ import annotations

from collections.abc import Callable

from tongyi_trace.report.model import Section
from tongyi_trace.report.sections import provenance
from tongyi_trace.run import RunDir

Builder = Callable[[RunDir], list[Section]]

BUILDERS: list[Builder] = [
    provenance.build,
]

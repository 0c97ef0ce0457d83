"""The Python API's defaults are the commands' (docs/api.md): Run.fit as `kvtrace fit`, Run.simulate as
`kvtrace simulate`."""

from __future__ import annotations

import inspect

from tongyi_trace.api import Run
from tongyi_trace.fit.tune import DEFAULT_CAPACITIES as FIT_CAPACITIES
from tongyi_trace.sim.sweep import SimulateOptions


def test_api_defaults_are_the_commands() -> None:
    fit = inspect.signature(Run.fit).parameters
    assert fit["capacities"].default == FIT_CAPACITIES  # a literal there: fit.tune imports the simulator
    sim = inspect.signature(Run.simulate).parameters
    assert (sim["policies"].default, sim["capacities"].default) == (SimulateOptions.policies,
                                                                     SimulateOptions.capacities)

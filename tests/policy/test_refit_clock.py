"""The online refit's schedule (policy/refit.py, RefitClock), which the simulator and the engine share."""

from __future__ import annotations

from tongyi_trace.policy.refit import RefitClock


def test_refits_every_refit_s_from_the_first_request_once_per_check() -> None:
    clock = RefitClock(60.0)
    assert not clock.due(10.0) and clock.next_s == 70.0  # the first request starts the clock
    assert not clock.due(69.9)
    assert clock.due(70.0) and clock.next_s == 130.0  # due exactly at its time
    assert clock.due(250.0) and clock.next_s == 310.0  # three due times passed: one refit, then the next after
    assert not clock.due(309.0) and clock.due(310.5)


def test_a_given_start_is_kept() -> None:
    clock = RefitClock(30.0, next_s=30.0)  # the simulator starts it at the trace's first time + refit_s
    assert clock.due(45.0) and clock.next_s == 60.0

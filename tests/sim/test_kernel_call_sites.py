"""Each policy hook is called from one place in the simulator's loop (sim/kernel.py), and a policy's large
helpers from one place in its hook: numba inlines a callee's IR at every call site, copying its scope once
per block, so a second site of WA's evict or GDSF's release doubled their share of the cold compile
(bench/bench_compile.py: WA's loop 45 -> 10.5 CPU s, GDSF's 14.4 -> 7.2 with one site each)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections import Counter
from typing import Any

from tongyi_trace.policy import wa_priority
from tongyi_trace.sim import kernel
from tongyi_trace.sim.policies import gdsf, s3fifo, wa


def _calls(fn: Any) -> Counter[str]:
    """How many times FN's source calls each plain name."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(fn, "py_func", fn))))
    return Counter(n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))


def test_the_loop_calls_each_large_hook_once() -> None:
    calls = _calls(kernel._run_loop)
    assert (calls["insert"], calls["release"], calls["evict"]) == (1, 1, 1)
    assert calls["access"] == 2  # the cached prefix and a block cached anyway: a few lines in every policy


def test_the_policies_call_their_large_helpers_once() -> None:
    assert _calls(wa.evict)["_leaf"] == 1 and _calls(wa._leaf)["log_reuse_prob"] == 1
    assert _calls(wa_priority.log_reuse_prob)["km_cdf"] == 2  # F(t) and F(t + life)
    assert _calls(gdsf.evict)["_sift_down"] == 1
    assert _calls(s3fifo.evict)["_evict_small"] == _calls(s3fifo.evict)["_evict_main"] == 1

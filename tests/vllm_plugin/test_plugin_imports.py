"""The plugin runs inside vLLM's processes: it must not load the analysis stack there. numba in
particular broke vLLM 0.32's CPU worker start (its Triton dispatcher walks every loaded module and
trips over llvmlite's objects), so the import chain of the plugin is checked here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("numba", "llvmlite", "polars", "duckdb", "pyarrow", "plotly", "scipy")


def test_plugin_configuration_loads_no_heavy_library(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"schema": "kvtrace.policy/1",
                                  "categories": {"text-1": {"reuse_prob": 0.5, "rate_per_s": 0.1, "life_s": 9}},
                                  "default": {"reuse_prob": 0.2, "rate_per_s": 0.1, "life_s": 9}}))
    code = (
        "import sys, json\n"
        "from tongyi_trace.vllm_plugin.config import load_config, guard_settings\n"
        "from tongyi_trace.vllm_plugin.queue import PolicyFreeQueue\n"
        "class B:\n    def __init__(s, i): s.block_id, s.block_hash = i, None\n"
        f"env = {{'KVTRACE_POLICY': {str(policy)!r}, 'KVTRACE_GUARD': '1', 'KVTRACE_REFIT_S': '60'}}\n"
        "cfg = load_config(env); guard_settings(env)\n"
        "PolicyFreeQueue([B(i) for i in range(8)], cfg.policy)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_engines_refit_needs_only_scipy_beyond_the_plugin(tmp_path: Path) -> None:
    """The online refit runs inside the engine, whose environment has vLLM, numpy and pyproject's `vllm`
    extra (scipy) only: a stale category's refit (Kaplan-Meier table and exponential MLE) must run with
    polars, duckdb, pyarrow and numba unimportable, and load nothing heavy but scipy."""
    code = (
        "import sys, json, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('polars', 'duckdb', 'pyarrow', 'numba'):\n"
        "            raise ImportError(f'{name} is not in the engine environment')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numpy as np\n"
        "from tongyi_trace.policy.reuse_model import Samples\n"
        "from tongyi_trace.policy.refit import CategoryFit, refit\n"
        "from tongyi_trace.policy.wa_priority import MODEL_EXP, km_grid_s\n"
        "rng = np.random.default_rng(1)\n"
        "d = rng.exponential(5.0, 400); seen = rng.random(400) < 0.6\n"
        "s = Samples(np.where(seen, d, 60.0), seen, np.ones(400, np.int64))\n"
        "old = CategoryFit(0.05, 1.0, tuple(0.0 for _ in km_grid_s()))\n"
        "fits, _ = refit({0: s}, {0: old}, MODEL_EXP)\n"
        "assert 0.5 < fits[0].reuse_prob < 0.7 and 0.1 < fits[0].rate_per_s < 0.3, fits\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["scipy"]

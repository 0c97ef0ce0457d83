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

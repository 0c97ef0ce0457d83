"""Fuzz: any JSON value in any field of a valid Bailian or Mooncake line either ingests (and then every
analysis runs on the run) or is exit 2 with exactly one line naming file:line and the field."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.lanes import examples
from tongyi_trace.analysis import run_analyses
from tongyi_trace.cli import app
from tongyi_trace.run import RunDir

runner = CliRunner()
BAILIAN = {"chat_id": 2, "parent_chat_id": 1, "timestamp": 1.5, "input_length": 40, "output_length": 3,
           "type": "text", "turn": 2, "hash_ids": [10, 11, 12], "user_id": "u1"}
MOONCAKE = {"timestamp": 1500, "input_length": 1000, "output_length": 3, "hash_ids": [10, 11]}
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
           | st.sampled_from(["[/x]", "[bold]", "", "NaN"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


def _check(base: dict[str, Any], first: dict[str, Any], field: str, value: Any) -> None:
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "f.jsonl"
        bad = {**base, field: value}
        trace.write_text(json.dumps(first) + "\n" + json.dumps(bad) + "\n")
        r = runner.invoke(app, ["ingest", str(trace), "-o", str(Path(d) / "run"), "-q"])
        out = r.output.strip()
        assert "Traceback" not in out, out
        if r.exit_code == 0:
            rep = run_analyses(RunDir(Path(d) / "run"), write=False)
            assert all(res.status in ("ok", "absent", "partial") for res in rep.results.values())
            return
        assert r.exit_code == 2, out
        assert out.count("\n") == 0, out
        assert re.search(r"f\.jsonl:[12]: field '\w+'", out), out
        assert not (Path(d) / "run").exists()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(BAILIAN)), value=VALUES)
def test_bailian_field_values(field: str, value: Any) -> None:
    first = {**BAILIAN, "chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "turn": 1}
    _check(BAILIAN, first, field, value)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(MOONCAKE)), value=VALUES)
def test_mooncake_field_values(field: str, value: Any) -> None:
    _check(MOONCAKE, {**MOONCAKE, "timestamp": 0}, field, value)

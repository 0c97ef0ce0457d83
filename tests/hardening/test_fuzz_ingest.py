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
           | st.sampled_from(["[/x]", "[bold]", "", "NaN", "te\x00xt", "\x00", "<b>\x00</b>"]))
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


@st.composite
def _sessions_trace(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A Bailian trace whose links form a forest, with arrival times drawn independently of the links (so a
    parent may arrive after its child), turns that may disagree with their parent's, and type names that
    may hold a NUL or another control character."""
    n = draw(st.integers(min_value=2, max_value=9))
    recs = []
    for i in range(n):
        parent = draw(st.sampled_from([-1, *range(i)]))
        recs.append({"chat_id": i, "parent_chat_id": parent,
                     "timestamp": float(draw(st.integers(min_value=0, max_value=5))),
                     "input_length": 32, "output_length": 2,
                     "type": draw(st.sampled_from(["text", "te\x00xt", "a\x1bb", "<b>x</b>"])),
                     "turn": draw(st.integers(min_value=1, max_value=4)), "hash_ids": [1, 100 + i]})
    return recs


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=_sessions_trace())
def test_parents_after_children_and_turn_disagreements_are_findings(recs: list[dict[str, Any]]) -> None:
    """Issue 42 item 4: every parent that arrives after its child is counted and cut (so no kept link goes
    back in time and analyze never sees a negative next-turn gap), every kept link whose turn is not its
    parent's + 1 is counted, and every analysis runs."""
    from tongyi_trace.trace.ingest import ingest_trace

    at = {r["chat_id"]: r["timestamp"] for r in recs}
    turn = {r["chat_id"]: r["turn"] for r in recs}
    late = [r for r in recs if r["parent_chat_id"] != -1 and at[r["parent_chat_id"]] > r["timestamp"]]
    kept = [r for r in recs if r["parent_chat_id"] != -1 and r not in late]
    mismatched = [r for r in kept if r["turn"] != turn[r["parent_chat_id"]] + 1]
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "f.jsonl"
        trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
        prov = ingest_trace(trace, Path(d) / "run")
        assert prov["findings"].get("parent_after_child", 0) == len(late)
        assert prov["findings"].get("turn_parent_mismatch", 0) == len(mismatched)
        req = RunDir(Path(d) / "run").requests()
        arrival = dict(zip(req["chat_id"].to_list(), req["arrival_s"].to_list(), strict=True))
        links = [(c, p) for c, p in zip(req["chat_id"].to_list(), req["parent_chat_id"].to_list(), strict=True)
                 if p != -1]
        assert sorted(links) == sorted((r["chat_id"], r["parent_chat_id"]) for r in kept)
        assert all(arrival[p] <= arrival[c] for c, p in links)
        rep = run_analyses(RunDir(Path(d) / "run"), write=False)
        assert all(res.status in ("ok", "absent", "partial") for res in rep.results.values())


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(BAILIAN)), value=SCALARS)
def test_a_duplicate_key_ingests_its_last_value_or_is_one_line(field: str, value: Any) -> None:
    """Issue 42 item 4: a line that gives a key twice (JSON allows it; the last value counts) ingests exactly as
    the line with only the last value, or fails with the same one line."""
    first = {**BAILIAN, "chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "turn": 1}
    last = {**BAILIAN, field: value}
    body = json.dumps(last)[1:-1]
    twice = "{" + json.dumps(field) + ": " + json.dumps(BAILIAN[field]) + ", " + body + "}"
    assert json.loads(twice) == last
    with tempfile.TemporaryDirectory() as d:
        outs = []
        for name, line in (("dup", twice), ("one", json.dumps(last))):
            trace = Path(d) / f"{name}.jsonl"
            trace.write_text(json.dumps(first) + "\n" + line + "\n")
            r = runner.invoke(app, ["ingest", str(trace), "-o", str(Path(d) / name), "-q"])
            assert "Traceback" not in r.output
            outs.append((r.exit_code, r.output.replace(f"{name}.jsonl", "F").replace(str(Path(d) / name), "RUN")))
        assert outs[0] == outs[1]
        if outs[0][0] == 0:
            assert RunDir(Path(d) / "dup").requests().equals(RunDir(Path(d) / "one").requests())
            found = [RunDir(Path(d) / name).provenance()["findings"].get("duplicate_keys") for name in ("dup", "one")]
            assert found == [1, None]  # the repeat is counted, never silent


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(["bailian", "mooncake"]), where=st.floats(min_value=0.0, max_value=1.0),
       skip=st.booleans())
def test_a_raw_nul_byte_anywhere_in_a_line_is_one_line_or_a_skipped_line(fmt: str, where: float, skip: bool) -> None:
    """Issue 42 item 4: a NUL byte written raw into a line (not the escape \\u0000: JSON allows no raw control
    character) is malformed JSON wherever it falls: one line naming f.jsonl:2, exit 2, no run folder; with
    --on-error skip that line is counted as skipped and the rest ingests."""
    first = {**BAILIAN, "chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "turn": 1} if fmt == "bailian" \
        else {**MOONCAKE, "timestamp": 0}
    line = json.dumps(BAILIAN if fmt == "bailian" else MOONCAKE).encode()
    at = round(where * len(line))
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "f.jsonl"
        trace.write_bytes(json.dumps(first).encode() + b"\n" + line[:at] + b"\x00" + line[at:] + b"\n")
        r = runner.invoke(app, ["ingest", str(trace), "-o", str(Path(d) / "run"), "-q",
                                *(["--on-error", "skip"] if skip else [])])
        out = r.output.strip()
        assert "Traceback" not in out, out
        if skip:
            assert r.exit_code == 0, out
            prov = RunDir(Path(d) / "run").provenance()
            assert prov["num_requests"] == 1 and prov["findings"]["skipped_lines"] == 1
            assert "f.jsonl:2: malformed JSON" in prov["finding_examples"]["skipped_lines"][0]
        else:
            assert r.exit_code == 2 and out.count("\n") == 0, out
            assert "f.jsonl:2: malformed JSON" in out, out
            assert not (Path(d) / "run").exists()

"""Synthetic traces (`kvtrace synth --profile`): determinism, line schema, structure, ingest, knobs."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.lanes import examples
from tongyi_trace.cli import app
from tongyi_trace.errors import UsageError
from tongyi_trace.trace import synth_core
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import PROFILES, TO_B, TO_C, generate, synth_to_file
from tongyi_trace.trace.synth_api import ApiParams, draw_api
from tongyi_trace.trace.synth_chat import draw_chat, draw_population
from tongyi_trace.trace.synth_core import EDIT, MAIN, REGENERATE, SessionRequests, SynthTrace, assemble, iter_lines

runner = CliRunner()
KEYS = ["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn",
        "hash_ids", "user_id"]


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def toc_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3,000-request to-C trace (seed 5)."""
    path = tmp_path_factory.mktemp("synth") / "toc.jsonl"
    synth_to_file("to-c", 5, path, num_requests=3000)
    return path


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    for path, seed in ((a, 7), (b, 7), (c, 8)):
        synth_to_file("to-c", seed, path, num_requests=1500)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    for ext in (".gz", ".zst"):  # compressed output is reproducible too (no mtime in the gzip header)
        x, y = tmp_path / f"x.jsonl{ext}", tmp_path / f"y.jsonl{ext}"
        synth_to_file("to-c", 7, x, num_requests=1500)
        synth_to_file("to-c", 7, y, num_requests=1500)
        assert x.read_bytes() == y.read_bytes()
    assert gzip.decompress((tmp_path / "x.jsonl.gz").read_bytes()) == a.read_bytes()
    assert zstandard.ZstdDecompressor().stream_reader((tmp_path / "x.jsonl.zst").read_bytes()).read() == \
        a.read_bytes()


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_is_deterministic_per_seed(profile: str) -> None:
    a, b, c = (generate(profile, seed, num_requests=600) for seed in (3, 3, 4))
    assert a.num_requests == 600
    assert np.array_equal(a.hash_ids, b.hash_ids) and np.array_equal(a.arrival_ms, b.arrival_ms)
    assert not np.array_equal(a.arrival_ms, c.arrival_ms)


def test_assemble_redos_golden() -> None:
    """One session, 16-token blocks, no prompt: turn 1 (new 20, out 12) is sent, discarded and
    regenerated; turn 2 (new 8) is sent as an edit first, then with another new input (new 40).

    Stream: turn 1 input 20 = A0 + partial; kept answer 12 -> turn 2 input = 20 + 12 + 40 = 72 =
    A0 A1 (tokens 16-31) + new blocks + partial. The edit has input 32 + 8 = 40: A0 A1 + its own partial."""
    sr = SessionRequests(
        session=np.zeros(4, dtype=np.int64), turn=np.array([1, 1, 2, 2]),
        arrival_ms=np.array([0, 9000, 30000, 41000]), type_code=np.zeros(4, dtype=np.int64),
        user=np.zeros(4, dtype=np.int64), sys_id=np.full(4, -1), new_tokens=np.array([20, 20, 8, 40]),
        output_tokens=np.array([5, 12, 7, 3]), type_names=("text",), sys_tokens_by_id=np.zeros(0, dtype=np.int64),
        redo_kind=np.array([REGENERATE, MAIN, EDIT, MAIN]))
    tr = assemble(sr)
    assert tr.input_tokens.tolist() == [20, 20, 40, 72]
    blocks = [tr.hash_ids[tr.offsets[i]:tr.offsets[i + 1]].tolist() for i in range(4)]
    assert blocks[0] == blocks[1] == [0, 1]  # a regenerate sends the same blocks
    assert blocks[2] == [0, 2, 3] and blocks[3][:2] == [0, 2] and blocks[3][2] != 3
    # both tries of a turn have the same parent: the kept request of the turn before
    assert tr.parent_chat_id.tolist() == [-1, -1, 1, 1]


def test_redos_and_repeats_are_siblings_with_the_same_blocks() -> None:
    tr = generate("to-c", 6, num_requests=4000)
    parent = tr.parent_chat_id
    kids = np.bincount(parent[parent >= 0], minlength=tr.num_requests)
    assert 0.01 < np.mean(kids >= 2) < 0.15  # some later turns were sent twice (regenerate, edit)
    api = generate("to-b", 6, num_requests=4000)
    first = [tuple(api.hash_ids[api.offsets[i]:api.offsets[i + 1]].tolist()) for i in range(api.num_requests)]
    assert 0.1 < 1 - len(set(first)) / len(first) < 0.3  # repeated sends of the same request


@pytest.mark.parametrize("args, field", [
    (["--duration", "inf"], "--duration"), (["--duration", "-5"], "--duration"),
    (["--scale", "nan"], "--scale"), (["--scale", "0"], "--scale"), (["--seed", "-1"], "--seed"),
    (["--requests", "0"], "requests"), (["--requests", "900000000"], "limit")])
def test_cli_rejects_absurd_values_in_one_line(tmp_path: Path, args: list[str], field: str) -> None:
    res = runner.invoke(app, ["synth", "--profile", "to-c", "-o", str(tmp_path / "x.jsonl"), *args])
    assert res.exit_code == 2 and field in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()


def test_lines_follow_the_bailian_schema(toc_small: Path) -> None:
    lines = toc_small.read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert len(recs) == 3000
    by_id = {r["chat_id"]: r for r in recs}
    last_ts = -1.0
    for line, r in zip(lines, recs, strict=True):
        assert list(r) == KEYS
        assert all(isinstance(r[k], int) and not isinstance(r[k], bool)
                   for k in ("chat_id", "parent_chat_id", "input_length", "output_length", "turn"))
        assert isinstance(r["timestamp"], float) and r["timestamp"] >= last_ts  # arrival order
        assert round(r["timestamp"] * 1000) == pytest.approx(r["timestamp"] * 1000, abs=1e-6)  # ms
        assert '"timestamp": ' in line and len(line.split('"timestamp": ')[1].split(",")[0].split(".")[1]) == 3
        last_ts = r["timestamp"]
        assert r["type"] in {"text", "image", "file", "search"}
        assert isinstance(r["user_id"], str)
        ids = r["hash_ids"]
        assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
        assert len(ids) == math.ceil(r["input_length"] / 16)
        if r["parent_chat_id"] == -1:
            assert r["turn"] == 1
            continue
        p = by_id[r["parent_chat_id"]]
        assert p["timestamp"] < r["timestamp"]
        assert (r["turn"], r["type"], r["user_id"]) == (p["turn"] + 1, p["type"], p["user_id"])
        # a child (also a discarded try of a turn) sends the parent's input, its output and a new input
        assert r["input_length"] > p["input_length"] + p["output_length"]
        full = p["input_length"] // 16  # every parent block but the last partial one
        assert ids[:full] == p["hash_ids"][:full]
        if p["input_length"] % 16:
            assert ids[full] != p["hash_ids"][full]  # the partial block's content changed


def test_ids_are_renumbered_by_first_appearance(toc_small: Path) -> None:
    seen = -1
    for r in _records(toc_small):
        for i in r["hash_ids"]:  # type: ignore[union-attr]
            assert i <= seen + 1
            seen = max(seen, i)


def test_trace_ingests_without_findings(toc_small: Path, tmp_path: Path) -> None:
    recs = _records(toc_small)
    prov = ingest_trace(toc_small, tmp_path / "run")
    assert prov["format"] == "bailian" and prov["block_size"] == 16
    assert prov["num_requests"] == len(recs)
    assert prov["num_block_refs"] == sum(len(r["hash_ids"]) for r in recs)  # type: ignore[arg-type]
    assert prov["findings"] == {}
    assert prov["has_users"] and prov["has_types"] and prov["has_turns"]


@pytest.fixture(scope="module")
def to_b_20k() -> SynthTrace:
    """One to-B trace of 20,000 requests (seed 3), drawn once for the module's tests (they only read it)."""
    return generate("to-b", 3, num_requests=20_000)


def test_to_b_programs_send_their_own_templates_single_turn(to_b_20k: SynthTrace) -> None:
    tr = to_b_20k
    assert set(tr.type_names) == {"api"}
    assert 0 < np.mean(tr.turn >= 2) < 0.001
    # every request opens with one of its program's prompt templates: a first block is one program's
    first = tr.hash_ids[tr.offsets[:-1]]
    owners = {f: np.unique(tr.user[first == f]).size for f in np.unique(first).tolist()}
    assert set(owners.values()) == {1}
    # a busy program has several templates (its expected requests / 400), a light one a single one
    counts = np.bincount(tr.user)
    busiest = int(np.argmax(counts))
    assert np.unique(first[tr.user == busiest]).size >= 10
    light = np.flatnonzero((counts > 0) & (counts <= 20))
    assert light.size > 50
    assert all(np.unique(first[tr.user == u]).size == 1 for u in light.tolist())


def test_to_b_repeats_retries_and_batch_jobs(to_b_20k: SynthTrace) -> None:
    tr = to_b_20k
    last_ms: dict[tuple[int, ...], int] = {}
    gaps_ms = []
    for i in range(tr.num_requests):
        key = tuple(tr.hash_ids[tr.offsets[i]:tr.offsets[i + 1]].tolist())
        if key in last_ms:
            gaps_ms.append(int(tr.arrival_ms[i]) - last_ms[key])
        last_ms[key] = int(tr.arrival_ms[i])
    gaps_s = np.array(gaps_ms) / 1000
    # sent twice: n-sampling (0.16 of requests, ~0.3 s apart) or a retry after a timeout (0.016, ~80 s)
    assert 0.12 < gaps_s.size / tr.num_requests < 0.18  # (0.16 + 0.016) / 1.176 = 0.15
    assert np.median(gaps_s) < 1.0
    assert 0.05 < np.mean(gaps_s > 10) < 0.13  # 0.016 / 0.176 = 0.09

    def template_gaps_within_10s(p: ApiParams) -> float:
        sr = draw_api(np.random.default_rng(3), 20_000, 7200.0, p)
        order = np.lexsort((sr.arrival_ms, sr.sys_id))
        same = sr.sys_id[order][1:] == sr.sys_id[order][:-1]
        return float(np.mean(np.diff(sr.arrival_ms[order])[same] <= 10_000))

    # batch jobs (one template over many inputs within minutes) put the prompt reuse within seconds:
    # measured 0.76 with them, 0.47 with steady streams only
    assert template_gaps_within_10s(TO_B) > template_gaps_within_10s(replace(TO_B, batch_share=0.0)) + 0.2


def test_to_c_users_stratified_and_only_heavy_users_keep_background_conversations() -> None:
    pop = draw_population(np.random.default_rng(4), 2000, TO_C)
    # one activity z-score per quantile stratum: the top 10% of users hold the same share at every seed
    # (0.9196 +- 0.0003 at seeds 4-9; independent draws give 0.903-0.929)
    top_share = [np.sort(draw_population(np.random.default_rng(s), 2000, TO_C).activity)[-200:].sum()
                 for s in range(4, 10)]
    assert max(top_share) - min(top_share) < 0.002
    assert pop.heavy.sum() == 200  # heavy_user_share 0.1 of the users, the most active ones
    assert pop.activity[pop.heavy].min() >= pop.activity[~pop.heavy].max()
    # a background conversation (every think time a slow return) is a heavy user's: conversations of 3+
    # kept turns whose every gap is over 5 minutes (two slow returns in a row elsewhere: p ~ 0.035^2)
    sr = draw_chat(np.random.default_rng(4), 20_000, 7200.0, TO_C)
    heavy = draw_population(np.random.default_rng(4), round(20_000 / TO_C.requests_per_user), TO_C).heavy
    kept = sr.redo_kind == MAIN
    sess, t, user = sr.session[kept], sr.arrival_ms[kept], sr.user[kept]
    same = sess[1:] == sess[:-1]
    short_gap = np.bincount(sess[1:][same & (np.diff(t) < 300_000)], minlength=sess.max() + 1)
    turns = np.bincount(sess)
    slow = np.flatnonzero((turns >= 3) & (short_gap == 0))
    is_slow = np.zeros(turns.size, dtype=bool)
    is_slow[slow] = True
    sess_heavy = heavy[user[np.searchsorted(sess, np.arange(turns.size))]]
    long_enough = turns >= 3
    assert slow.size > 100
    assert is_slow[long_enough & sess_heavy].mean() > 0.1  # 326 of 1,992 at seed 4; others 0 of 82
    assert is_slow[long_enough & ~sess_heavy].mean() < 0.01


def test_scale_knobs() -> None:
    tr = generate("to-c", 2, num_requests=4000, duration_s=600.0)
    assert tr.num_requests == 4000
    assert tr.arrival_ms.max() < 600_000
    assert generate("to-b", 2, num_requests=4000, scale=0.5).num_requests == 2000
    assert generate("to-c", 2, scale=0.05).num_requests == round(43_000 * 0.05)
    with pytest.raises(UsageError, match="scale"):
        generate("to-c", 2, scale=0)
    with pytest.raises(UsageError, match="profile"):
        generate("to-x", 2)


def test_cli_json_summary_and_errors(tmp_path: Path) -> None:
    out = tmp_path / "b.jsonl"
    res = runner.invoke(app, ["synth", "--profile", "to-b", "--seed", "4", "--requests", "800", "-o", str(out),
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["num_requests"] == 800 == len(out.read_text().splitlines())
    assert doc["num_block_refs"] == sum(len(r["hash_ids"]) for r in _records(out))  # type: ignore[arg-type]
    assert doc["type_share"] == {"api": 1.0}
    res = runner.invoke(app, ["synth", "-o", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 2 and "exactly one of --profile" in res.output
    res = runner.invoke(app, ["synth", "--profile", "to-c"])
    assert res.exit_code == 2 and "-o/--out" in res.output
    assert "Traceback" not in res.output


def test_assemble_golden() -> None:
    """Two sessions by hand, 16-token blocks; prompt 0 has 40 tokens (blocks P0 P1 wholly inside it).

    Session 0 (prompt 0): turn 1 new 10 -> input 50 = P0 P1 S2 (tokens 32-47: 8 prompt + 8 new, the
    session's own) + partial a (48-49); turn 2 at 5 s after output 20: input 50 + 20 + 6 = 76 =
    P0 P1 S2 S3 (full now, so not a) + partial b (64-75).
    Session 1 (no prompt) at 1 s: new 32 -> input 32 = T0 T1 (no partial block)."""
    sr = SessionRequests(
        session=np.array([0, 0, 1]), turn=np.array([1, 2, 1]), arrival_ms=np.array([0, 5000, 1000]),
        type_code=np.array([0, 0, 1]), user=np.array([3, 3, 4]), sys_id=np.array([0, 0, -1]),
        new_tokens=np.array([10, 6, 32]), output_tokens=np.array([20, 1, 2]), type_names=("text", "file"),
        sys_tokens_by_id=np.array([40]))
    tr = assemble(sr)
    assert tr.input_tokens.tolist() == [50, 32, 76]
    # ids by first appearance: P0=0 P1=1 S2=2 a=3 | T0=4 T1=5 | S3=6 b=7
    assert [tr.hash_ids[tr.offsets[i]:tr.offsets[i + 1]].tolist() for i in range(3)] == [
        [0, 1, 2, 3], [4, 5], [0, 1, 2, 6, 7]]
    assert tr.parent_chat_id.tolist() == [-1, -1, 0]
    lines = list(iter_lines(tr, with_users=True))
    assert lines[2] == ('{"chat_id": 2, "parent_chat_id": 0, "timestamp": 5.000, "input_length": 76, '
                        '"output_length": 1, "type": "text", "turn": 2, "hash_ids": [0, 1, 2, 6, 7], '
                        '"user_id": "u3"}\n')


def test_assemble_in_chunks_equals_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100x trace is assembled in chunks of whole requests (about CHUNK_REFS references each); the chunks'
    edges (here every ~1,000 references, a few requests) change no id."""
    sr = draw_chat(np.random.default_rng(4), 2000, 7200.0, TO_C)
    whole = assemble(sr)
    assert whole.num_block_refs > 20_000
    monkeypatch.setattr(synth_core, "CHUNK_REFS", 1000)
    chunked = assemble(sr)
    assert np.array_equal(chunked.hash_ids, whole.hash_ids) and np.array_equal(chunked.offsets, whole.offsets)
    assert chunked.hash_ids.max() + 1 == np.unique(whole.hash_ids).size


@st.composite
def _sessions(draw: st.DrawFn) -> SessionRequests:
    n_sess = draw(st.integers(1, 6))
    turns = [draw(st.integers(1, 4)) for _ in range(n_sess)]
    n = sum(turns)
    sys_tokens = np.array(draw(st.lists(st.integers(1, 80), min_size=1, max_size=3)))
    sess_sys = [draw(st.integers(-1, sys_tokens.size - 1)) for _ in range(n_sess)]
    t0 = [draw(st.integers(0, 10_000)) for _ in range(n_sess)]
    session = np.repeat(np.arange(n_sess), turns)
    turn = np.concatenate([np.arange(1, t + 1) for t in turns])
    gaps = np.array([draw(st.integers(1, 5000)) for _ in range(n)])
    arrival = np.zeros(n, dtype=np.int64)
    for s in range(n_sess):
        m = session == s
        arrival[m] = t0[s] + np.cumsum(np.where(turn[m] == 1, 0, gaps[m]))
    return SessionRequests(
        session=session, turn=turn, arrival_ms=arrival, type_code=np.zeros(n, dtype=np.int64),
        user=session.copy(), sys_id=np.array([sess_sys[s] for s in session]),
        new_tokens=np.array([draw(st.integers(1, 70)) for _ in range(n)]),
        output_tokens=np.array([draw(st.integers(0, 40)) for _ in range(n)]),
        type_names=("text",), sys_tokens_by_id=sys_tokens)


def _blocks(tr: SynthTrace, i: int) -> list[int]:
    return [int(x) for x in tr.hash_ids[tr.offsets[i]:tr.offsets[i + 1]]]


@settings(max_examples=examples(150), deadline=None)
@given(_sessions())
def test_assemble_properties(sr: SessionRequests) -> None:
    tr = assemble(sr)
    n = tr.num_requests
    assert tr.num_block_refs == int(np.sum(-(-tr.input_tokens // 16)))
    assert np.all(np.diff(tr.arrival_ms) >= 0)
    for i in range(n):
        p = int(tr.parent_chat_id[i])
        if p < 0:
            continue
        assert p < i and tr.turn[i] == tr.turn[p] + 1
        full = int(tr.input_tokens[p]) // 16
        assert _blocks(tr, i)[:full] == _blocks(tr, p)[:full]
    # blocks of different sessions are equal only inside a shared system prompt
    sess_of = {}
    for i in range(n):
        root = i
        while tr.parent_chat_id[root] >= 0:
            root = int(tr.parent_chat_id[root])
        sess_of[i] = root
    sys_ids = sr.sys_id[np.lexsort((np.arange(sr.session.size), sr.arrival_ms))]
    for i in range(n):
        for j in range(i):
            if sess_of[i] == sess_of[j]:
                continue
            common = set(_blocks(tr, i)) & set(_blocks(tr, j))
            if common:
                assert sys_ids[i] == sys_ids[j] >= 0
                prompt_full = int(sr.sys_tokens_by_id[sys_ids[i]]) // 16
                assert common == set(_blocks(tr, i)[:prompt_full])

"""`kvtrace synth --like RUN --check` (tongyi_trace/calibration/twin.py): the twin against its run.

Issue 38 item 4's tolerances on both public Mooncake traces (skipped when ../shared/traces is absent)
(one seed each in the fast lane, seeds 1-3 in the full one) and on the to-C profile (a quarter
size) at two seeds; what misses is asserted as known (docs/synth.md,
"The twin of a run": its misses), so that a fix or a regression both show. And privacy: no timestamp,
length or hash-id sequence of the original appears in the twin."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tongyi_trace.calibration.twin import check_twin
from tongyi_trace.cli import app
from tongyi_trace.fit.synth_like import synth_like_to_file
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.synth import synth_to_file

runner = CliRunner()


def _failing(rows: list) -> set[str]:
    return {r.key for r in rows if not r.ok}


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.full), pytest.param(3, marks=pytest.mark.full)])
def test_twin_of_mooncake_conversation_passes_every_figure(mooncake_conversation_run: Path, seed: int) -> None:
    rows = check_twin(mooncake_conversation_run, seed)
    assert len(rows) == 9 and _failing(rows) == set(), [r.to_json() for r in rows]
    by = {r.key: r for r in rows}
    # the run's own figures as /work/shared/traces/README.md measures them
    assert by["ideal_hit"].run == pytest.approx(0.3664, abs=1e-4)
    # seed 1 (docs/synth.md's table): ideal .366, LRU at 1% .067 against the run's .052
    if seed == 1:
        assert by["ideal_hit"].twin == pytest.approx(0.366, abs=0.002)
        assert by["lru_1%"].twin == pytest.approx(0.067, abs=0.002)


@pytest.fixture(scope="module")
def mooncake_synthetic_run(mooncake_synthetic_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("mcs") / "run"
    ingest_trace(mooncake_synthetic_path, run)
    return run


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.full), pytest.param(3, marks=pytest.mark.full)])
def test_twin_of_mooncake_synthetic(mooncake_synthetic_run: Path, seed: int) -> None:
    """The synthetic trace holds its first turns early and later turns late (4% of requests share a
    prefix in its first tenth, 97% in its last): the twin learns who shares per time bin."""
    rows = check_twin(mooncake_synthetic_run, seed)
    by = {r.key: r for r in rows}
    assert by["ideal_hit"].run == pytest.approx(0.6396, abs=1e-4)
    assert len(rows) == 9 and _failing(rows) == set(), [r.to_json() for r in rows]
    if seed == 1:  # docs/synth.md's table
        assert by["ideal_hit"].twin == pytest.approx(0.636, abs=0.002)
        assert by["lru_10%"].twin == pytest.approx(0.270, abs=0.002)


@pytest.mark.parametrize("seed", [1, 2])
def test_twin_of_the_to_c_profile(tmp_path: Path, seed: int) -> None:
    """The to-C profile at a quarter size (seed 1): every figure holds but LRU at 5% (.411-.417 against
    .456) and the reuse-time KS (.106-.109), as docs/synth.md records (at full size every figure
    holds at seeds 1-3)."""
    synth_to_file("to-c", 1, tmp_path / "t.jsonl", scale=0.25)
    ingest_trace(tmp_path / "t.jsonl", tmp_path / "run")
    rows = check_twin(tmp_path / "run", seed)
    assert _failing(rows) == {"lru_5%", "ks_reuse_time"}, [r.to_json() for r in rows]


def _ngrams(seq: list, n: int) -> set[tuple]:
    return {tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)}


def test_twin_copies_no_sequence_of_the_original(mooncake_conversation_path: Path,
                                                 mooncake_conversation_run: Path, tmp_path: Path) -> None:
    orig = [json.loads(line) for line in mooncake_conversation_path.read_text().splitlines()]
    synth_like_to_file(mooncake_conversation_run, 1, tmp_path / "twin.jsonl")
    twin = [json.loads(line) for line in (tmp_path / "twin.jsonl").read_text().splitlines()]
    assert len(twin) == len(orig)

    def cols(recs: list[dict]) -> tuple[list, list, list]:
        gaps = np.diff([r["timestamp"] for r in recs]).tolist()
        return gaps, [(r["input_length"], r["output_length"]) for r in recs], \
            [tuple(r["hash_ids"]) for r in recs]

    (g1, l1, h1), (g2, l2, h2) = cols(orig), cols(twin)
    # no run of 5 inter-arrival gaps (ignoring the batches' zero gaps), no 3 consecutive (input, output)
    # length pairs, no 3 consecutive hash-id lists of the original appear in the twin
    nz1, nz2 = [g for g in g1 if g], [g for g in g2 if g]
    assert _ngrams(nz1, 5).isdisjoint(_ngrams(nz2, 5))
    assert _ngrams(l1, 3).isdisjoint(_ngrams(l2, 3))
    assert _ngrams(h1, 3).isdisjoint(_ngrams(h2, 3))
    # and no single request repeats an original (input, output) pair with its timestamp
    assert not {(r["timestamp"], r["input_length"], r["output_length"]) for r in orig} & \
        {(r["timestamp"], r["input_length"], r["output_length"]) for r in twin}


def test_cli_check_like_prints_run_and_twin(mooncake_conversation_run: Path) -> None:
    res = runner.invoke(app, ["synth", "--like", str(mooncake_conversation_run), "--seed", "1", "--check", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "kvtrace.synth-twin-check/1" and all(r["ok"] for r in doc["rows"])
    res = runner.invoke(app, ["synth", "--like", str(mooncake_conversation_run), "--check", "-q"])
    assert res.exit_code == 0 and "ideal hit ratio" in res.output and "pass" in res.output

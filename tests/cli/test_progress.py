"""Progress totals are real: ingest counts the bytes of the trace file read (the compressed bytes of a
.gz/.zst file) against its size; fit counts categories fitted and candidate simulations against their
number."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
import zstandard

from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.parquet_reader import PROGRESS_LINES

NUM_LINES = 25_000  # more than one chunk (20,000 lines) and many 4,096-line position updates


@pytest.fixture(scope="module")
def bailian_lines() -> bytes:
    """A Bailian trace of NUM_LINES single-turn requests, 3 categories."""
    types = ("text", "search", "file")
    return b"".join(json.dumps({
        "chat_id": i, "parent_chat_id": -1, "timestamp": i * 0.01, "input_length": 48, "output_length": 4,
        "type": types[i % 3], "turn": 1, "hash_ids": [i % 50, 1000 + i % 7, 2000 + i], "user_id": f"u{i % 40}",
    }).encode() + b"\n" for i in range(NUM_LINES))


def _ingest_calls(trace: Path, out: Path) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    ingest_trace(trace, out, progress=lambda done, total: calls.append((done, total)))
    return calls


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_ingest_progress_counts_the_file_bytes(bailian_lines: bytes, tmp_path: Path, suffix: str) -> None:
    trace = tmp_path / f"t{suffix}"
    data = {".jsonl": bailian_lines, ".jsonl.gz": gzip.compress(bailian_lines),
            ".jsonl.zst": zstandard.ZstdCompressor().compress(bailian_lines)}[suffix]
    trace.write_bytes(data)
    size = len(data)
    assert suffix == ".jsonl" or size < len(bailian_lines) / 3  # compressed: the total is the file, not the text
    calls = _ingest_calls(trace, tmp_path / "run")
    assert {total for _, total in calls} == {size}
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == size
    # the first chunk is reported before the end of the file (.zst is read 1 MiB at a time: all of this one)
    assert 0 < done[0] < size if suffix != ".jsonl.zst" else done[0] == size


def test_ingest_progress_of_a_parquet_trace(bailian_lines: bytes, tmp_path: Path) -> None:
    from tongyi_trace.run import open_run
    from tongyi_trace.trace.export import export_trace

    src = tmp_path / "t.jsonl"
    src.write_bytes(bailian_lines)
    ingest_trace(src, tmp_path / "run")
    pq_trace = tmp_path / "t.parquet"
    export_trace(open_run(tmp_path / "run"), pq_trace)
    calls = _ingest_calls(pq_trace, tmp_path / "run2")
    size = pq_trace.stat().st_size
    assert {total for _, total in calls} == {size}
    # rows read x bytes per row, every PROGRESS_LINES rows (inside one chunk: the whole trace is one)
    assert calls[-1] == (size, size) and calls[0][0] == size * PROGRESS_LINES // NUM_LINES
    assert len(calls) == NUM_LINES // PROGRESS_LINES + 2  # each batch, the last partial one, the end


def test_fit_progress_counts_categories_and_simulations(bailian_lines: bytes, tmp_path: Path) -> None:
    import polars as pl

    from tongyi_trace.fit.policy_fit import fit_policy

    src = tmp_path / "t.jsonl"
    src.write_bytes(bailian_lines[: bailian_lines.index(b"\n", 3000 * 60) + 1])  # a few thousand requests
    ingest_trace(src, tmp_path / "run")
    phases: dict[str, list[tuple[int, int]]] = defaultdict(list)
    outcome = fit_policy(tmp_path / "run", tmp_path / "policy.json", test="10:30", capacities="50,200",
                         jobs=1, on_progress=lambda what, done, total: phases[what].append((done, total)))
    for what, calls in phases.items():
        totals = {t for _, t in calls}
        assert len(totals) == 1 and calls[-1][0] == totals.pop(), what  # one total, reached at the end
        assert [d for d, _ in calls] == sorted(d for d, _ in calls), what
    train_cats = phases["fitting categories (train window)"]
    # the categories (3 types x turn bucket 1) and the pooled "default": one row each in the fit table
    assert train_cats[-1][1] == len(outcome.rows) == 4
    assert phases["fitting categories (test window)"][-1][1] == 4
    sims = {w: c[-1][1] for w, c in phases.items() if w.startswith("capacity-aware fit")}
    tuning = pl.read_parquet(tmp_path / "run" / "fit" / "tuning.parquet")
    assert sum(sims.values()) == tuning.height  # every simulation counted is a row of the tuning table
    assert sims["capacity-aware fit: LRU on the train window"] == 2  # one per capacity

"""Ingest: golden tables on the tiny fixture, the public Mooncake figures, every bad-input path."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
import zstandard
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.run import RunDir
from tongyi_trace.trace.export import export_trace
from tongyi_trace.trace.ingest import ingest_trace

runner = CliRunner()


def _write(path: Path, records: list[dict[str, object] | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _req(chat_id: int, parent: int = -1, ts: float = 0.0, n: int = 2, **kw: object) -> dict[str, object]:
    rec: dict[str, object] = {"chat_id": chat_id, "parent_chat_id": parent, "timestamp": ts,
                              "input_length": 16 * n, "output_length": 4, "type": "text", "turn": 1,
                              "hash_ids": list(range(chat_id * 10, chat_id * 10 + n))}
    rec.update(kw)
    return rec


def test_tiny_bailian_golden_tables(tiny_bailian_path: Path, tmp_path: Path) -> None:
    prov = ingest_trace(tiny_bailian_path, tmp_path)
    assert (prov["format"], prov["block_size"], prov["num_requests"]) == ("bailian", 16, 6)
    assert (prov["num_block_refs"], prov["num_distinct_blocks"]) == (23, 10)
    assert prov["duration_s"] == 30.0 and prov["findings"] == {}
    assert prov["has_users"] and prov["has_types"] and prov["has_sessions"]
    run = RunDir(tmp_path)
    req = run.requests()
    assert req["session_id"].to_list() == [1, 2, 1, 4, 1, 1]
    assert req["category"].to_list() == ["text-1", "text-1", "text-2", "search-1", "text-3+", "text-3+"]
    blocks = run.blocks()
    per_req = blocks.group_by("req_idx", maintain_order=True).agg("chain_idx")["chain_idx"].to_list()
    assert per_req == [[0, 1, 2], [0, 1], [0, 1, 3, 4], [5, 6, 7], [0, 1, 3, 4, 8], [0, 1, 3, 4, 8, 9]]
    assert blocks.filter(pl.col("req_idx") == 0)["num_tokens"].to_list() == [16, 16, 8]


def test_mooncake_conversation_figures(mooncake_conversation_run: Path) -> None:
    prov = RunDir(mooncake_conversation_run).provenance()
    assert prov["num_requests"] == 12_031
    assert prov["num_block_refs"] == 288_500
    assert prov["num_distinct_blocks"] == 182_790
    assert prov["duration_s"] == pytest.approx(3537, abs=1)
    assert prov["format"] == "mooncake" and prov["block_size"] == 512 and not prov["has_types"]


def test_chain_ids_give_the_mooncake_partition(mooncake_conversation_run: Path) -> None:
    """Mooncake ids are already prefix-chained: our chain ids must partition blocks exactly like them."""
    b = RunDir(mooncake_conversation_run).blocks(["block_id", "chain_idx"])
    pairs = b.unique()
    assert pairs.height == b["block_id"].n_unique() == b["chain_idx"].n_unique()


def test_parquet_round_trip_is_identical(tiny_bailian_path: Path, tmp_path: Path) -> None:
    a = RunDir(tmp_path / "a")
    ingest_trace(tiny_bailian_path, a.path)
    export_trace(a, tmp_path / "t.parquet")
    b = RunDir(tmp_path / "b")
    prov = ingest_trace(tmp_path / "t.parquet", b.path)
    assert prov["format"] == "parquet"
    assert a.requests().equals(b.requests())
    assert a.blocks().equals(b.blocks())


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_input(tiny_bailian_path: Path, tmp_path: Path, suffix: str) -> None:
    raw = tiny_bailian_path.read_bytes()
    packed = gzip.compress(raw) if suffix == ".gz" else zstandard.ZstdCompressor().compress(raw)
    path = tmp_path / f"trace.jsonl{suffix}"
    path.write_bytes(packed)
    prov = ingest_trace(path, tmp_path / "run")
    assert (prov["num_requests"], prov["num_distinct_blocks"]) == (6, 10)


@pytest.mark.parametrize(("line", "needle"), [
    ('{"chat_id": 2, "parent_chat_id": -1, "timestamp": 1', ":2: malformed JSON"),
    ('{"chat_id": 2, "parent_chat_id": -1, "timestamp": "soon", "input_length": 32, "output_length": 1, '
     '"type": "text", "turn": 1, "hash_ids": [1, 2]}', ":2: field 'timestamp' must be a number"),
    ('{"chat_id": 2, "parent_chat_id": -1, "timestamp": 1, "input_length": 32, "output_length": 1, '
     '"type": "text", "turn": 1, "hash_ids": [1, "b"]}', ":2: field 'hash_ids' must be a list of integers"),
    ('{"chat_id": 2, "parent_chat_id": -1, "timestamp": 1, "input_length": 32, "output_length": 1, '
     '"type": "text", "hash_ids": [1, 2]}', ":2: field 'turn' is missing"),
])
def test_bad_line_is_one_line_error_and_skippable(tmp_path: Path, line: str, needle: str) -> None:
    path = _write(tmp_path / "t.jsonl", [_req(1), line, _req(3)])
    result = runner.invoke(app, ["ingest", str(path), "-o", str(tmp_path / "run"), "-q"])
    assert result.exit_code == 2
    message = result.output.strip()
    assert needle in message and message.count("\n") == 0 and "Traceback" not in message
    assert str(path) in message
    prov = ingest_trace(path, tmp_path / "run2", on_error="skip")
    assert prov["num_requests"] == 2 and prov["findings"] == {"skipped_lines": 1}


def test_negative_length_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_req(1), _req(2, output_length=-3)])
    with pytest.raises(InputError, match=r"t.jsonl:2: field 'output_length' is negative"):
        ingest_trace(path, tmp_path / "run")


def test_empty_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(InputError, match="empty"):
        ingest_trace(path, tmp_path / "run")


def test_duplicate_chat_id_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_req(1), _req(2, ts=1), _req(1, ts=2)])
    with pytest.raises(InputError, match=r"t.jsonl:3: field 'chat_id' 1 appears twice \(also line 1\)"):
        ingest_trace(path, tmp_path / "run")


def test_parent_cycle_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_req(1), _req(2, parent=3, ts=1), _req(3, parent=2, ts=2)])
    with pytest.raises(InputError, match=r"t.jsonl:2: field 'parent_chat_id' 3 is part of a cycle"):
        ingest_trace(path, tmp_path / "run")


def test_findings_are_counted_not_fatal(tmp_path: Path) -> None:
    recs = [_req(1, ts=5.0), _req(2, ts=1.0), _req(3, parent=99, ts=6.0, turn=2),
            _req(4, ts=7.0, input_length=100)]  # 100 tokens need 7 blocks, has 2
    prov = ingest_trace(_write(tmp_path / "t.jsonl", recs), tmp_path / "run")
    assert prov["findings"] == {"hash_len_mismatch": 1, "orphan_parent": 1, "timestamps_out_of_order": 1}
    req = RunDir(tmp_path / "run").requests()
    assert req["chat_id"].to_list() == [2, 1, 3, 4]  # stably sorted by timestamp
    assert req.filter(pl.col("chat_id") == 3)["parent_chat_id"].item() == -1
    assert req.filter(pl.col("chat_id") == 3)["session_id"].item() == 3


def test_turn_buckets_option(tiny_bailian_path: Path, tmp_path: Path) -> None:
    ingest_trace(tiny_bailian_path, tmp_path, turn_buckets=[1, 3])
    cats = RunDir(tmp_path).requests()["category"].to_list()
    assert cats == ["text-1-2", "text-1-2", "text-1-2", "search-1-2", "text-3+", "text-3+"]


def test_cli_json_figures(tiny_bailian_path: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["ingest", str(tiny_bailian_path), "-o", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc == {"schema": "kvtrace.ingest-output/1", "run_dir": str((tmp_path / "r").resolve()),
                   "format": "bailian", "block_size": 16, "num_requests": 6, "num_block_refs": 23,
                   "num_distinct_blocks": 10, "duration_s": 30.0, "sessions": "given", "findings": {}}


def test_hash_ids_checked_per_chunk_report_the_first_bad_line(tmp_path: Path) -> None:
    """Ids are converted once per chunk; a bad id is still reported at its own line, before a later bad line."""
    path = _write(tmp_path / "t.jsonl", [_req(1), _req(2, ts=1.0, hash_ids=[2**64 - 1, -1]),
                                         _req(3, ts=2.0, output_length=-3), _req(4, ts=3.0)])
    with pytest.raises(InputError, match=r"t.jsonl:2: field 'hash_ids' mixes a negative id \(-1\)"):
        ingest_trace(path, tmp_path / "run")
    prov = ingest_trace(path, tmp_path / "skip", on_error="skip")
    assert prov["num_requests"] == 2 and prov["findings"] == {"skipped_lines": 2}
    assert RunDir(tmp_path / "skip").requests()["chat_id"].to_list() == [1, 4]


def test_a_boolean_id_is_found_whatever_the_text_around_it(tmp_path: Path) -> None:
    """The quick boolean check reads the text after the "hash_ids" key: a value spelled "hash_ids" (and a
    list) before it must not hide a true among the ids."""
    line = json.dumps({"note": "hash_ids", "tags": [1], **_req(2, ts=1.0, hash_ids=[20, True])})
    path = _write(tmp_path / "t.jsonl", [_req(1), line])
    with pytest.raises(InputError, match=r"t.jsonl:2: field 'hash_ids' must be a list of integers \(flat\), "
                                         r"found True"):
        ingest_trace(path, tmp_path / "run")
    ok = _write(tmp_path / "ok.jsonl", [_req(1), _req(2, ts=1.0, type="hash_ids", hash_ids=[-20, 21])])
    prov = ingest_trace(ok, tmp_path / "ok")
    assert prov["num_block_refs"] == 4 and prov["id_domain"] == "signed"


def test_parent_after_child_is_a_finding_and_a_root(tmp_path: Path) -> None:
    """Issue 42 #8: chat 0 at 42.9 s names chat 39, which arrives at 959 s: counted, named and made a root (its
    gap would be -916 s); chat 40 keeps its link to 39; a turn that is not its parent's + 1 is counted too."""
    recs = [_req(0, parent=39, ts=42.9, turn=2), _req(39, ts=959.0), _req(40, parent=39, ts=1000.0, turn=2),
            _req(41, parent=40, ts=1001.0, turn=5)]
    prov = ingest_trace(_write(tmp_path / "t.jsonl", recs), tmp_path / "run")
    assert prov["findings"] == {"parent_after_child": 1, "turn_parent_mismatch": 1}
    assert prov["finding_examples"]["parent_after_child"] == [
        f"{tmp_path / 't.jsonl'}:1: chat_id 0 at 42.9 s has parent_chat_id 39, which arrives later (959 s, line 2); "
        "treated as a root"]
    assert "t.jsonl:4: turn 5 of chat_id 41 is not its parent's turn 2 + 1 (line 3)" in \
        prov["finding_examples"]["turn_parent_mismatch"][0]
    req = RunDir(tmp_path / "run").requests().sort("chat_id")
    assert req["parent_chat_id"].to_list() == [-1, -1, 39, 40]
    assert req["session_id"].to_list() == [0, 39, 39, 39]


def test_a_duplicate_key_is_a_finding_in_the_ingest_summary(tmp_path: Path) -> None:
    """Issue 42: duplicate JSON keys (the last wins) gave no finding. Two lines name a key twice: counted,
    the first named by file and line, in provenance.json and in the ingest summary; the last value is used."""
    from typer.testing import CliRunner

    from tongyi_trace.cli import app

    twice = json.dumps(_req(2, ts=1.0)).replace('"turn": 1', '"turn": 5, "turn": 1')
    extra = json.dumps(_req(3, ts=2.0, src="a")).replace('"src": "a"', '"src": "a", "src": "b"')
    path = _write(tmp_path / "t.jsonl", [_req(1), twice, extra])
    r = CliRunner().invoke(app, ["ingest", str(path), "-o", str(tmp_path / "run"), "--json"])
    assert r.exit_code == 0, r.output
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["findings"] == {"duplicate_keys": 2}
    assert prov["finding_examples"]["duplicate_keys"] == [
        f"{path}:2: names the key 'turn' twice; the last value is used (as every JSON reader does): fix the line "
        "that wrote it",
        f"{path}:3: names the key 'src' twice; the last value is used (as every JSON reader does): fix the line "
        "that wrote it"]
    assert json.loads(r.stdout)["findings"] == {"duplicate_keys": 2}
    assert RunDir(tmp_path / "run").requests()["turn"].to_list() == [1, 1, 1]
    table = CliRunner().invoke(app, ["ingest", str(path), "-o", str(tmp_path / "run2")])
    assert "duplicate_keys: 2" in table.output

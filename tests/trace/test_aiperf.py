"""AIPerf's mooncake_trace format (session_id, delay, no timestamp): detected, ingested with its sessions,
turns, parents and arrivals (tests/fixtures/aiperf_sessions.jsonl, figures derived in its README), and its
bad lines named in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.run import RunDir
from tongyi_trace.trace.formats import detect_format
from tongyi_trace.trace.ingest import ingest_trace

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "aiperf_sessions.jsonl"
runner = CliRunner()


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_fixture_ingests_with_its_sessions(tmp_path: Path) -> None:
    assert detect_format(FIXTURE) == "aiperf"
    prov = ingest_trace(FIXTURE, tmp_path / "run")
    assert (prov["format"], prov["block_size"], prov["sessions"]) == ("aiperf", 512, "given")
    assert (prov["num_requests"], prov["num_block_refs"], prov["num_distinct_blocks"]) == (7, 18, 9)
    assert prov["findings"] == {}  # sessions listed one after another is not "out of order"
    assert prov["duration_s"] == 4.5 and prov["has_sessions"] and prov["has_turns"] and not prov["has_types"]
    req = RunDir(tmp_path / "run").requests()
    assert req["arrival_s"].to_list() == [0.0, 0.0, 0.5, 2.0, 3.0, 3.5005, 4.5]
    assert req["chat_id"].to_list() == [0, 5, 2, 1, 6, 3, 4]
    assert req["parent_chat_id"].to_list() == [-1, -1, -1, 0, -1, 1, 2]
    assert req["turn"].to_list() == [1, 1, 1, 2, 1, 3, 2]
    assert req["session_id"].to_list() == [0, 5, 2, 0, 6, 0, 2]
    assert req["category"].to_list() == ["unknown-1", "unknown-1", "unknown-1", "unknown-2", "unknown-1",
                                         "unknown-3+", "unknown-2"]
    assert req["input_tokens"].to_list() == [1000, 512, 600, 1600, 512, 2100, 1100]
    # the blocks follow the requests into arrival order: a3 (req 5) extends a2 (req 3) by one block
    per_req = (RunDir(tmp_path / "run").blocks().group_by("req_idx", maintain_order=True)
               .agg("chain_idx")["chain_idx"].to_list())
    assert per_req[3][:4] == per_req[5][:4] and len(per_req[5]) == 5 and per_req[4] == [per_req[0][0]]


def test_cli_ingest_reads_it(tmp_path: Path) -> None:
    result = runner.invoke(app, ["ingest", str(FIXTURE), "-o", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["format"], doc["num_requests"], doc["sessions"]) == ("aiperf", 7, "given")


@pytest.mark.parametrize(("record", "needle"), [
    ({"session_id": "a", "timestamp": 5, "delay": 1, "input_length": 512, "output_length": 1, "hash_ids": [1]},
     ":2: field 'delay' is given with a timestamp; give one of timestamp"),
    ({"session_id": "a", "delay": -5, "input_length": 512, "output_length": 1, "hash_ids": [1]},
     ":2: field 'delay' is negative (-5), expected milliseconds >= 0"),
    ({"session_id": "a", "text_input": "hello", "output_length": 1},
     ":2: field 'text_input' is text without hash_ids: kvtrace needs the block hashes"),
    ({"session_id": ["a"], "input_length": 512, "output_length": 1, "hash_ids": [1]},
     ":2: field 'session_id' must be a string or integer"),
    ({"session_id": "a", "delay": True, "input_length": 512, "output_length": 1, "hash_ids": [1]},
     ":2: field 'delay' must be a number of milliseconds"),
    ({"chat_id": 3, "input_length": 512, "output_length": 1, "hash_ids": [1]},
     ":2: field 'chat_id' belongs to a Bailian record, but this is an AIPerf trace"),
])
def test_bad_lines_are_one_line_errors_and_skippable(tmp_path: Path, record: dict[str, object], needle: str) -> None:
    first = {"session_id": "a", "input_length": 512, "output_length": 1, "hash_ids": [1]}
    path = _write(tmp_path / "t.jsonl", [first, record])
    result = runner.invoke(app, ["ingest", str(path), "-o", str(tmp_path / "run"), "-q"])
    message = result.output.strip()
    assert result.exit_code == 2 and needle in message and message.count("\n") == 0, message
    if "chat_id" not in record:
        prov = ingest_trace(path, tmp_path / "run2", on_error="skip")
        assert prov["num_requests"] == 1 and prov["findings"] == {"skipped_lines": 1}


def test_an_unknown_record_names_all_its_fields_uncut(tmp_path: Path) -> None:
    """The message listed the fields through a 40-character cut ("...'output_len"): now by name, whole."""
    path = _write(tmp_path / "t.jsonl", [{"session_id": "a", "delay": 1, "input_length": 5, "output_length": 1,
                                          "prompt_tokens": 3}])
    with pytest.raises(InputError, match=r"unknown record with fields delay, input_length, output_length, "
                       r"prompt_tokens, session_id; expected Bailian .*AIPerf \(session_id, delay"):
        detect_format(path)


def test_brief_never_cuts_a_word() -> None:
    from tongyi_trace.errors import brief
    from tongyi_trace.trace.records import show

    fields = ["delay", "hash_ids", "input_length", "output_length", "session_id"]
    assert show(fields) == "['delay', 'hash_ids' ..."  # whole items, then a mark that more follow
    text = "zstd: frame  header \\n truncated in the middle of the window descriptor " * 3
    cut = brief(text, 60)
    assert len(cut) <= 60 and cut.endswith(" ...") and "\\n" in cut
    assert cut.removesuffix(" ...").split()[-1] in text.split()  # the last word is whole
    assert brief("short  and\\nsweet") == "short and\\nsweet"


def test_a_duplicate_key_is_a_finding(tmp_path: Path) -> None:
    """Issue 42: as in the Bailian and Mooncake readers, a line naming a key twice is counted and named."""
    lines = FIXTURE.read_text().splitlines()
    lines[1] = lines[1].replace('"delay": 2000', '"delay": 9, "delay": 2000')
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    prov = ingest_trace(path, tmp_path / "run")
    assert prov["findings"]["duplicate_keys"] == 1
    assert prov["finding_examples"]["duplicate_keys"] == [
        f"{path}:2: names the key 'delay' twice; the last value is used (as every JSON reader does): fix the line "
        "that wrote it"]
    same = ingest_trace(FIXTURE, tmp_path / "same")
    assert "duplicate_keys" not in same["findings"]
    assert RunDir(tmp_path / "run").requests().equals(RunDir(tmp_path / "same").requests())

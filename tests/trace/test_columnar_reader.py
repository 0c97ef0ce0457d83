"""The columnar JSONL reader: the same chunks as the line-by-line reader on every file it takes, and a hand-over
(ReadLineByLine) on everything its column checks cannot vouch for, after which ingest gives the line-by-line
result (values, line numbers, errors)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tongyi_trace.errors import InputError
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace
from tongyi_trace.trace.reader import Chunk, ReadLineByLine, ReadStats, read_chunks


def _rec(i: int, **kw: object) -> dict[str, object]:
    rec: dict[str, object] = {"chat_id": i, "parent_chat_id": i - 1 if i % 3 else -1, "timestamp": 0.25 * i,
                              "input_length": 40, "output_length": 4, "type": "text", "turn": 1 + i % 3,
                              "hash_ids": [i, -5, 1 << 62], "user_id": f"u{i % 2}"}
    rec.update(kw)
    return rec


def _write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_bytes((end.join(lines) + end).encode())
    return path


def _lines(n: int = 6, **kw: object) -> list[str]:
    return [json.dumps(_rec(i, **kw)) for i in range(n)]


def _chunks(path: Path, fmt: str, columnar: bool) -> tuple[list[Chunk], ReadStats]:
    stats = ReadStats()
    return list(read_chunks(path, fmt, "fail", stats, columnar=columnar)), stats


def _same(a: list[Chunk], b: list[Chunk]) -> None:
    assert len(a) == len(b) == 1
    for name in Chunk.__dataclass_fields__:
        x, y = getattr(a[0], name), getattr(b[0], name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        else:
            assert x == y, name


def test_bailian_chunks_equal_the_line_readers(tmp_path: Path) -> None:
    lines = _lines()
    lines[2] = json.dumps({k: v for k, v in _rec(2).items() if k != "user_id"})  # user_id is optional
    lines[3] = json.dumps(_rec(3, timestamp=1, user_id=None))  # an integer time; a null user
    path = _write(tmp_path / "t.jsonl", lines, end="\r\n")
    columnar, stats = _chunks(path, "bailian", True)
    _same(columnar, _chunks(path, "bailian", False)[0])
    assert columnar[0].user_id == ["u0", "u1", None, None, "u0", "u1"]
    assert columnar[0].hash_ids[:3].tolist() == [0, -5, 1 << 62]
    assert stats.num_lines == 6 and stats.num_bytes_read == path.stat().st_size


def test_mooncake_chunks_equal_the_line_readers(tmp_path: Path) -> None:
    lines = [json.dumps({"timestamp": 1500 * i, "input_length": 1024, "output_length": 9, "hash_ids": [i, i + 1]})
             for i in range(5)]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines))  # no newline after the last line
    columnar, _ = _chunks(path, "mooncake", True)
    _same(columnar, _chunks(path, "mooncake", False)[0])
    assert columnar[0].timestamp_s.tolist() == [0.0, 1.5, 3.0, 4.5, 6.0]
    assert columnar[0].chat_id.tolist() == [-1] * 5


HAND_OVERS = {  # line 3 (index 2) replaced by: what only the line-by-line reader can judge
    "blank line": "  ",
    "blank line, then two records on a line (as many records as lines)":
        "\t\n" + json.dumps(_rec(3)) + json.dumps(_rec(9)),
    "two records on a line": json.dumps(_rec(2)) + json.dumps(_rec(9)),
    "integer as float": json.dumps(_rec(2, input_length=40.0)),
    "missing field": json.dumps({k: v for k, v in _rec(2).items() if k != "turn"}),
    "null field": json.dumps(_rec(2, type=None)),
    "null id": json.dumps(_rec(2, hash_ids=[1, None])),
    "unknown field": json.dumps(_rec(2, note="x")),
    "integer user id": json.dumps(_rec(2, user_id=7)),
    "unsigned id": json.dumps(_rec(2, hash_ids=[1 << 63])),
    "turn out of range": json.dumps(_rec(2, turn=-1)),
    "NaN time": json.dumps(_rec(2)).replace('"timestamp": 0.5', '"timestamp": NaN'),
    "malformed": "{",
}


@pytest.mark.parametrize("what", HAND_OVERS)
def test_what_the_columns_cannot_vouch_for_goes_line_by_line(tmp_path: Path, what: str) -> None:
    lines = _lines()
    lines[2] = HAND_OVERS[what]
    path = _write(tmp_path / "t.jsonl", lines)
    with pytest.raises(ReadLineByLine):
        _chunks(path, "bailian", True)


def test_ingest_after_a_hand_over_is_the_line_readers(tmp_path: Path) -> None:
    lines = _lines()
    lines[4] = json.dumps(_rec(4, user_id=7))
    path = _write(tmp_path / "t.jsonl", [*lines[:2], "", *lines[2:]])  # a blank line: line numbers shift by one
    prov = ingest_trace(path, tmp_path / "run")
    assert prov["num_requests"] == 6
    assert RunDir(tmp_path / "run").requests()["user_id"].to_list() == ["u0", "u1", "u0", "u1", "7", "u1"]
    bad = _write(tmp_path / "bad.jsonl", [*lines[:2], "", lines[2], json.dumps(_rec(3, input_length=-2))])
    with pytest.raises(InputError, match=r"bad\.jsonl:5: field 'input_length'"):
        ingest_trace(bad, tmp_path / "run2")


def test_compressed_and_mixed_format_files_go_line_by_line(tmp_path: Path) -> None:
    import gzip

    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(("\n".join(_lines()) + "\n").encode()))
    with pytest.raises(ReadLineByLine):
        _chunks(gz, "bailian", True)
    mixed = _write(tmp_path / "m.jsonl", [json.dumps({"timestamp": 1, "input_length": 1, "output_length": 1,
                                                      "hash_ids": [1]}), json.dumps(_rec(1))])
    with pytest.raises(ReadLineByLine):
        _chunks(mixed, "mooncake", True)
    with pytest.raises(InputError, match=r"m\.jsonl:2: field 'chat_id' belongs to a Bailian record"):
        ingest_trace(mixed, tmp_path / "run", fmt="mooncake")

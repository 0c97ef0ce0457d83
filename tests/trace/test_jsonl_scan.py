"""The compiled JSONL scan (trace/jsonl_scan.py) against the reader's precise per-line path: on every line
shape, the same chunks, statistics and errors whether the scan takes the line or leaves it to the precise
checks; and the scan takes the usual lines (else the comparison would prove nothing)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.errors import InputError
from tongyi_trace.trace import jsonl_reader, jsonl_scan, source
from tongyi_trace.trace.reader import read_chunks
from tongyi_trace.trace.records import ReadStats

_BASE = {"chat_id": 7, "parent_chat_id": -1, "timestamp": 12.5, "input_length": 40, "output_length": 3,
         "type": "text", "turn": 1, "hash_ids": [4, 5, 6], "user_id": "u1"}
_MOON = {"timestamp": 1500, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]}


def _line(rec: dict[str, Any], **kw: Any) -> str:
    return json.dumps({**rec, **kw})


def _sub(old: str, new: str, rec: dict[str, Any] = _BASE) -> str:
    text = json.dumps(rec)
    assert old in text
    return text.replace(old, new, 1)


BAILIAN_LINES = [
    _line(_BASE),
    json.dumps(_BASE, separators=(",", ":")),
    " \t{ \"chat_id\" :7 ,\t\"parent_chat_id\": -1, \"timestamp\":12.5,\"input_length\":40,\"output_length\":3,"
    "\"type\":\"text\",\"turn\":1,\"hash_ids\":[ 4 ,5,6 ] } \r",
    json.dumps(dict(reversed(list(_BASE.items())))),
    *(_line(_BASE, user_id=u) for u in ("", "a b", 12, -3, 0, None, 1 << 70, 1.5, True, [1])),
    _sub('"user_id": "u1"', '"user_id": -0'),
    json.dumps({k: v for k, v in _BASE.items() if k != "user_id"}),
    *(_sub('"timestamp": 12.5', f'"timestamp": {t}') for t in (
        "0", "-0", "-0.0", "0.0", "1e3", "1E+3", "1.5e-3", "123.456", "100000000000", "100000000000.5",
        "1e11", "-1e11", "1.00000000001e11", "1e400", "5e-324", "0.30000000000000004", "9007199254740993",
        "123456789.123456789", "0.000000000000000000000001", "12.50000000000000000001", "01", "1.", ".5",
        "-", "1e", "NaN", "Infinity", '"12"', "null", "true", "[1]")),
    *(_line(_BASE, input_length=v) for v in (0, (1 << 31) - 1, 1 << 31, -1, 1.0, True, "5", None)),
    *(_line(_BASE, chat_id=v) for v in ((1 << 63) - 1, -(1 << 63), 1 << 63, -(1 << 63) - 1)),
    *(_line(_BASE, turn=v) for v in (0, (1 << 31) - 1, 1 << 31, -1, None)),
    *(_line(_BASE, hash_ids=v) for v in (
        [], [0], [-5, 3], [-(1 << 63), (1 << 63) - 1], [1 << 63, 1], [1 << 64], [-1, 1 << 63], [1.0],
        [True], [[1]], "abc", None, [1, None])),
    _sub('"hash_ids": [4, 5, 6]', '"hash_ids": [4,]'),
    _sub('"hash_ids": [4, 5, 6]', '"hash_ids": [04]'),
    *(_line(_BASE, type=v) for v in ("", "with space", "文本", 'a"b', "tab\there", None, 5, ["x"])),
    _sub('"type": "text"', '"type": "\\u0074ext"'),
    _sub('"chat_id"', '"chat\\u005fid"'),
    *(_line(_BASE, x=v) for v in (1, -2.5e7, "s", "es\ncaped \\ \u00e9", None, True, False, [1, 2], {"a": 1})),
    *(_sub('"x": 1', f'"x": {v}', {**_BASE, "x": 1}) for v in (
        '"a\\xb"', '"\\u12"', '"\\u00zz"', '"\\u00e9 \\/ \\b"', "01", "-", "1.5e", "tru", "nul", '"a', "1 2")),
    _sub('"turn": 1', '"turn": 1, "turn": 2'),
    _sub('"x": 1', '"x": 1, "x": 2', {**_BASE, "x": 1}),
    _sub('"u1"}', '"u1",}'),
    _sub('"u1"}', '"u1"'),
    _line(_BASE) + " {}",
    _line(_BASE) + " x",
    "{}", "[]", "null", "7", "garbage", '{"chat_id": 7',
    "", "   ", "\t", "\r", "\x0c",
    _line(_MOON),
    json.dumps({k: v for k, v in _BASE.items() if k != "turn"}),
]

MOONCAKE_LINES = [
    _line(_MOON),
    json.dumps(_MOON, separators=(",", ":")),
    *(_line(_MOON, timestamp=t) for t in (0, 1, -7, 1.5, 0.1, 1e14, 1e14 + 1, 123456789012, 2.5e-3)),
    _line(_MOON, user_id="u"), _line(_MOON, user_id=[1]), _line(_MOON, session=3),
    _line(_MOON, chat_id=3), _line(_MOON, type="text"), _line(_MOON, turn=None),
    json.dumps({k: v for k, v in _MOON.items() if k != "input_length"}),
    _line(_MOON, hash_ids=[1 << 63]), _line(_MOON, hash_ids=[-1]),
    "", "  ", "{}",
]


def _read(path: Path, fmt: str, on_error: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | str:
    """The chunks and statistics of reading PATH, or the error's message."""
    stats = ReadStats()
    try:
        chunks = [{k: (v.view(np.int64) if isinstance(v, np.ndarray) and v.dtype == np.float64 else v)
                   for k, v in vars(c).items()} for c in read_chunks(path, fmt, on_error, stats)]
    except InputError as e:
        return str(e)
    kept = {k: v for k, v in vars(stats).items() if k not in ("on_read",)}
    return chunks, kept


def _same(a: object, b: object) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    assert isinstance(a, tuple) and isinstance(b, tuple)
    (ca, sa), (cb, sb) = a, b
    if sa != sb or len(ca) != len(cb):
        return False
    for x, y in zip(ca, cb, strict=True):
        for k in x:
            u, v = x[k], y[k]
            if isinstance(u, np.ndarray):
                if u.dtype != v.dtype or not np.array_equal(u, v):
                    return False
            elif u != v or [type(e) for e in u] != [type(e) for e in v]:
                return False
    return True


@pytest.fixture
def precise_lines(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The line numbers that reach the precise checks, as the read goes."""
    seen: list[int] = []
    line = jsonl_reader.JsonlReader.line

    def counted(self: jsonl_reader.JsonlReader, line_no: int, text: bytes) -> None:
        seen.append(line_no)
        line(self, line_no, text)
    monkeypatch.setattr(jsonl_reader.JsonlReader, "line", counted)
    return seen


def _compare(tmp_path: Path, fmt: str, text: str, on_error: str, monkeypatch: pytest.MonkeyPatch,
             ) -> tuple[object, object]:
    path = tmp_path / "t.jsonl"
    path.write_bytes(text.encode())
    fast = _read(path, fmt, on_error)
    with monkeypatch.context() as m:
        m.setattr(jsonl_scan, "scan", lambda buf, pos, *a: (pos, 0, 0, 0, jsonl_scan.SLOW))
        slow = _read(path, fmt, on_error)
    return fast, slow


@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize(("fmt", "lines", "usual"), [("bailian", BAILIAN_LINES, _BASE),
                                                      ("mooncake", MOONCAKE_LINES, _MOON)])
def test_every_line_shape_reads_as_the_precise_path_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, lines: list[str], usual: dict[str, Any],
        on_error: str) -> None:
    first = _line(usual, hash_ids=[0, 1])
    for i, variant in enumerate(lines):
        for tail in ("\n" + _line(usual, chat_id=9, hash_ids=[0, 2]) if fmt == "bailian" else "\n" + first, ""):
            text = f"{first}\n{variant}{tail}"  # a variant in the middle, and last without its newline
            fast, slow = _compare(tmp_path, fmt, text, on_error, monkeypatch)
            assert _same(fast, slow), (i, variant, fast, slow)


def test_the_scan_takes_the_usual_lines_and_leaves_the_others(tmp_path: Path, precise_lines: list[int]) -> None:
    usual = [_line(_BASE, chat_id=i, hash_ids=[i, i + 1], user_id=u)
             for i, u in enumerate(("u", 3, None, "v w"))] + ["", "  \r"]
    odd = [_line(_BASE, chat_id=10, type="文本"), _line(_BASE, chat_id=11, timestamp=0.30000000000000004),
           _line(_BASE, chat_id=12, x={"a": 1}), _line(_BASE, chat_id=13, hash_ids=[1 << 63])]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(usual + odd + usual[:2]) + "\n")
    chunks = list(read_chunks(path, "bailian", "fail", ReadStats()))
    assert precise_lines == [7, 8, 9, 10]
    assert sum(len(c) for c in chunks) == 10
    assert chunks[0].type[4] == "文本" and chunks[0].user_id[:4] == ["u", "3", None, "v w"]


def test_chunks_split_alike_across_scan_calls_and_precise_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 ) -> None:
    monkeypatch.setattr(jsonl_reader, "CHUNK_LINES", 5)
    monkeypatch.setattr(jsonl_reader, "CHUNK_REFS", 7)
    monkeypatch.setattr(jsonl_reader, "_SCAN_RECORDS", 2)
    monkeypatch.setattr(jsonl_reader, "_SCAN_IDS", 3)
    monkeypatch.setattr(source, "BLOCK_BYTES", 300)
    rng = np.random.default_rng(5)
    rows = []
    for i in range(60):
        n = int(rng.integers(0, 9))
        rec = _line(_BASE, chat_id=i, hash_ids=list(range(i, i + n)))
        rows.append(rec if i % 7 else _line(_BASE, chat_id=i, type="é", hash_ids=list(range(n))))
        if i % 11 == 0:
            rows.append("")
    fast, slow = _compare(tmp_path, "bailian", "\n".join(rows) + "\n", "fail", monkeypatch)
    assert _same(fast, slow)
    assert isinstance(fast, tuple) and len(fast[0]) > 10


def test_compressed_traces_read_alike(tmp_path: Path) -> None:
    import gzip

    import zstandard

    text = ("\n".join(_line(_BASE, chat_id=i, hash_ids=[i, i + 1]) for i in range(3000)) + "\n").encode()
    got = []
    for name, data in (("t.jsonl", text), ("t.jsonl.gz", gzip.compress(text)),
                       ("t.jsonl.zst", zstandard.ZstdCompressor().compress(text))):
        (tmp_path / name).write_bytes(data)
        got.append(_read(tmp_path / name, "bailian", "fail"))
    for g in got[1:]:
        assert isinstance(g, tuple) and isinstance(got[0], tuple)
        assert _same((g[0], {}), (got[0][0], {}))


def _scan_number(text: str) -> tuple[int, float]:
    buf = np.frombuffer(text.encode() + b",", dtype=np.uint8)
    verdict, value, end = jsonl_scan._number(buf, 0, buf.shape[0])
    assert verdict == jsonl_scan.INVALID or end == len(text)
    return verdict, value


_finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=examples(600), deadline=None)
@given(st.one_of(
    _finite.map(repr),
    st.tuples(_finite.filter(lambda x: abs(x) < 1e15), st.integers(0, 12)).map(lambda t: f"{t[0]:.{t[1]}f}"),
    st.tuples(_finite, st.integers(0, 20)).map(lambda t: f"{t[0]:.{t[1]}e}"),
    st.integers(-(1 << 60), 1 << 60).map(str),
    st.tuples(st.integers(-(10 ** 17), 10 ** 17), st.integers(-30, 30)).map(lambda t: f"{t[0]}e{t[1]}")))
def test_an_exact_number_is_the_correctly_rounded_double(text: str) -> None:
    verdict, value = _scan_number(text)
    want = json.loads(text)
    assert verdict != jsonl_scan.INVALID
    if verdict == jsonl_scan.EXACT:
        want = float(want)
        assert value == want and math.copysign(1, value) == math.copysign(1, want)


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(-(1 << 65), 1 << 65))
def test_integer_literals_within_int64_only(v: int) -> None:
    buf = np.frombuffer(f"{v}]".encode(), dtype=np.uint8)
    ok, got, _ = jsonl_scan._int_literal(buf, 0, buf.shape[0])
    assert ok == (-(1 << 63) <= v < 1 << 63)
    assert not ok or got == v


@pytest.mark.parametrize(("text", "verdict"), [
    ("01", jsonl_scan.INVALID), ("1.", jsonl_scan.INVALID), ("-", jsonl_scan.INVALID), (".5", jsonl_scan.INVALID),
    ("1e", jsonl_scan.INVALID), ("1e5", jsonl_scan.EXACT), ("-0", jsonl_scan.EXACT), ("1e400", jsonl_scan.INEXACT),
    ("0.30000000000000004", jsonl_scan.INEXACT), ("9007199254740993", jsonl_scan.INEXACT)])
def test_number_verdicts(text: str, verdict: int) -> None:
    assert _scan_number(text)[0] == verdict


def test_a_line_longer_than_a_block_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "BLOCK_BYTES", 64)
    rows = [_line(_BASE, chat_id=i, hash_ids=list(range(100 * i, 100 * i + 50 * (i % 3)))) for i in range(9)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(rows))  # no newline at the end
    assert [s.count(b"\n") for s in source.line_segments(path)] == [1] * 8 + [0]
    chunks = list(read_chunks(path, "bailian", "fail", ReadStats()))
    assert [int(n) for n in np.diff(chunks[0].offsets)] == [50 * (i % 3) for i in range(9)]


REPEATS = [  # (line, the key named twice or None)
    (_sub('"turn": 1', '"turn": 1, "turn": 2'), "turn"),
    (_sub('"user_id": "u1"', '"user_id": "u0", "user_id": "u1"'), "user_id"),
    (_sub('"x": 1', '"x": 1, "y": 0, "x": 2', {**_BASE, "x": 1}), "x"),
    (_sub('"x": 1', '"x": 1, "\\u0078": 2', {**_BASE, "x": 1}), "x"),  # the same key, spelled with an escape
    (_line(_BASE, x={"a": 1}).replace('{"a": 1}', '{"a": 1, "a": 2}'), "a"),
    (_line(_BASE, x='a": 1, "x'), None),  # the text of a key in a string: no repeat
    (_line(_BASE, **{f"k{i}": i for i in range(12)}), None),  # many other fields, each once
    (_line(_BASE), None),
]


@pytest.mark.parametrize(("line", "key"), REPEATS)
def test_a_repeated_key_is_a_finding_on_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str,
                                                   key: str | None) -> None:
    """Issue 42: a key given twice (JSON readers keep the last value) was read without a word. The compiled
    scan leaves such a line to the precise path, which counts it (duplicate_keys, the first line named); a read
    without the scan counts the same."""
    first = _line(_BASE, chat_id=1, hash_ids=[0, 1])
    fast, slow = _compare(tmp_path, "bailian", f"{first}\n{line}\n{line}\n", "fail", monkeypatch)
    assert _same(fast, slow)
    assert isinstance(fast, tuple)
    stats = fast[1]
    if key is None:
        assert "duplicate_keys" not in stats["skipped"]
    else:
        assert stats["skipped"]["duplicate_keys"] == 2
        assert stats["examples"]["duplicate_keys"][0] == (
            f"{tmp_path / 't.jsonl'}:2: names the key {key!r} twice; the last value is used (as every JSON reader "
            "does): fix the line that wrote it")

"""The captured trace's line writer (tongyi_trace/capture/writer.py): every finished line reaches the OS at
once, and the closed file is complete for `kvtrace ingest`'s reader."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest
import zstandard

from tests.capture.conftest import read_lines
from tongyi_trace.capture.writer import LineWriter
from tongyi_trace.errors import UsageError

LINE = b'{"chat_id":%d,"parent_chat_id":-1,"timestamp":%d.5,"input_length":20,"output_length":2,' \
       b'"type":"text","turn":1,"hash_ids":[0,1]}'


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz", "t.jsonl.zst"])
def test_each_line_is_readable_as_soon_as_it_is_written(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    w = LineWriter(path)
    for i in range(3):
        w.write_line(LINE % (i, i))
        raw = path.read_bytes()  # what another process sees now, before the close
        if name.endswith(".gz"):
            text = zlib.decompressobj(wbits=31).decompress(raw)
        elif name.endswith(".zst"):
            text = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        else:
            text = raw
        assert text.count(b"\n") == i + 1
    w.close()
    w.close()  # idempotent
    assert [r["chat_id"] for r in read_lines(path)] == [0, 1, 2]
    if name.endswith(".gz"):
        assert gzip.decompress(path.read_bytes()).count(b"\n") == 3  # the trailer is written: a complete member


def test_closed_zst_is_one_complete_frame(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.zst"
    w = LineWriter(path)
    w.write_line(LINE % (0, 0))
    w.close()
    params = zstandard.get_frame_parameters(path.read_bytes())
    assert params.window_size > 0
    from tongyi_trace.trace.formats import detect_format
    from tongyi_trace.trace.reader import read_chunks
    from tongyi_trace.trace.records import ReadStats

    assert detect_format(path) == "bailian"
    chunks = list(read_chunks(path, "bailian", "fail", ReadStats()))
    assert sum(len(c) for c in chunks) == 1


def test_refuses_an_existing_file_and_other_suffixes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("keep me\n")
    with pytest.raises(UsageError, match=r"t.jsonl: exists; choose another name or pass --overwrite"):
        LineWriter(path)
    assert path.read_text() == "keep me\n"
    LineWriter(path, overwrite=True).close()
    assert path.read_bytes() == b""
    with pytest.raises(UsageError, match=r"must be named \*.jsonl, \*.jsonl.gz or \*.jsonl.zst"):
        LineWriter(tmp_path / "t.csv")
    with pytest.raises(UsageError, match="does not exist; create it first"):
        LineWriter(tmp_path / "nope" / "t.jsonl")

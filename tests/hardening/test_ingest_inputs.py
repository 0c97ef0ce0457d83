"""Ingest under hostile input: every bad trace, path or option is exit 2 with one line naming the file
(and line and field where there is one), never a traceback, a shorter trace, or a folder left behind."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import zstandard
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.run import RunDir
from tongyi_trace.trace.ingest import ingest_trace

runner = CliRunner()


def _req(chat_id: int, parent: int = -1, ts: float = 0.0, n: int = 2, **kw: object) -> dict[str, object]:
    rec: dict[str, object] = {"chat_id": chat_id, "parent_chat_id": parent, "timestamp": ts,
                              "input_length": 16 * n, "output_length": 4, "type": "text", "turn": 1,
                              "hash_ids": list(range(chat_id * 10, chat_id * 10 + n))}
    rec.update(kw)
    return rec


def _lines(records: list[dict[str, object] | str]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def _write(path: Path, records: list[dict[str, object] | str]) -> Path:
    path.write_text(_lines(records))
    return path


def _one_line_error(args: list[str], *needles: str) -> str:
    r = runner.invoke(app, ["ingest", *args, "-q"])
    msg = r.output.strip()
    assert r.exit_code == 2, msg
    assert msg.count("\n") == 0 and "Traceback" not in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


# ---- data loss: a damaged compressed file is an error, never a shorter trace -------------------------------
def test_truncated_zst_second_frame_is_an_error_not_a_shorter_trace(tmp_path: Path) -> None:
    c = zstandard.ZstdCompressor()
    first = c.compress(_lines([_req(i, ts=float(i)) for i in range(1, 51)]).encode())
    second = c.compress(_lines([_req(i, ts=float(i)) for i in range(51, 101)]).encode())
    whole = tmp_path / "whole.jsonl.zst"
    whole.write_bytes(first + second)
    assert ingest_trace(whole, tmp_path / "w")["num_requests"] == 100  # every frame is read
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(first + second[: len(second) // 2])
    with pytest.raises(InputError, match=r"cut.jsonl.zst: truncated .zst file"):
        ingest_trace(cut, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_truncated_or_fake_gz_is_one_line(tmp_path: Path) -> None:
    data = gzip.compress(_lines([_req(i, ts=float(i)) for i in range(1, 200)]).encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    _one_line_error([str(cut), "-o", str(tmp_path / "a")], "cut.jsonl.gz: truncated .gz file")
    fake = _write(tmp_path / "fake.jsonl.gz", [_req(1)])
    _one_line_error([str(fake), "-o", str(tmp_path / "b")], "fake.jsonl.gz: damaged or not really .gz file")
    _one_line_error([str(fake), "-o", str(tmp_path / "b"), "--format", "bailian"], "not really .gz")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---- paths and options -------------------------------------------------------------------------------------
def test_bad_paths_and_options_are_one_line(tmp_path: Path) -> None:
    good = _write(tmp_path / "t.jsonl", [_req(1), _req(2, ts=1.0)])
    out = str(tmp_path / "run")
    _one_line_error([str(good), "-o", out, "--format", "csv"], "--format 'csv'", "bailian, mooncake, aiperf, parquet")
    _one_line_error([str(good), "-o", out, "--format", "parquet"], "t.jsonl: not a readable Parquet file")
    _one_line_error([str(good), "-o", out, "--block-size", str(10**20)], "--block-size")
    _one_line_error([str(good), "-o", out, "--block-size", "0"], "--block-size 0")
    _one_line_error([str(tmp_path / "nope.jsonl"), "-o", out], "nope.jsonl: no such file")
    _one_line_error([str(tmp_path), "-o", out, "--format", "bailian"], "is a directory, not a trace file")
    _one_line_error([str(good), "-o", str(good)], "t.jsonl: exists and is not a folder")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    _one_line_error([str(good), "-o", str(tmp_path / "busy")], "not a kvtrace run (notes.txt)")
    assert not Path(out).exists()


def test_bad_parquet_is_one_line(tmp_path: Path) -> None:
    ingest_trace(_write(tmp_path / "t.jsonl", [_req(1), _req(2, ts=1.0)]), tmp_path / "run")
    good = tmp_path / "t.parquet"
    assert runner.invoke(app, ["export", str(tmp_path / "run"), "-o", str(good), "-q"]).exit_code == 0
    table = pq.read_table(good)
    meta = {b"kvtrace.block_size": b"banana"}
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "meta.parquet")
    _one_line_error([str(tmp_path / "meta.parquet"), "-o", str(tmp_path / "a")],
                    "metadata 'kvtrace.block_size' is b'banana'")
    data = good.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    _one_line_error([str(tmp_path / "cut.parquet"), "-o", str(tmp_path / "b"), "--format", "parquet"],
                    "cut.parquet: not a readable Parquet file")
    nulls = table.set_column(table.schema.get_field_index("input_length"), "input_length",
                             pa.array([32, None], type=pa.int64()))
    pq.write_table(nulls, tmp_path / "nulls.parquet")
    _one_line_error([str(tmp_path / "nulls.parquet"), "-o", str(tmp_path / "c")],
                    "nulls.parquet:2: field 'input_length' is null")
    nan = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", pa.array([0.0, float("nan")]))
    pq.write_table(nan, tmp_path / "nan.parquet")
    _one_line_error([str(tmp_path / "nan.parquet"), "-o", str(tmp_path / "d")],
                    "nan.parquet:2: field 'timestamp' is not finite")
    null_id = table.set_column(table.schema.get_field_index("hash_ids"), "hash_ids",
                               pa.array([[10, 11], [20, None]], type=pa.list_(pa.int64())))
    pq.write_table(null_id, tmp_path / "nullid.parquet")
    _one_line_error([str(tmp_path / "nullid.parquet"), "-o", str(tmp_path / "e")],
                    "nullid.parquet:2: field 'hash_ids' holds a null id")


# ---- values: types, ranges, id domain, formats -------------------------------------------------------------
@pytest.mark.parametrize(("override", "needle"), [
    ({"hash_ids": [[1], [2, 3]]}, "field 'hash_ids' must be a list of integers (flat), found [1]"),
    ({"hash_ids": [1, [2]]}, "field 'hash_ids' must be a list of integers (flat), found [2]"),
    ({"hash_ids": [1, True]}, "field 'hash_ids' must be a list of integers (flat), found True"),
    ({"input_length": 2**63}, "field 'input_length' is 9223372036854775808, out of range"),
    ({"input_length": 2**63 - 1}, "field 'input_length' is 9223372036854775807, out of range"),
    ({"input_length": True}, "field 'input_length' must be an integer token count, got True"),
    ({"timestamp": 1e308}, "field 'timestamp' is 1e+308, out of range"),
    ({"timestamp": -1e308}, "field 'timestamp' is -1e+308, out of range"),
    ({"timestamp": False}, "field 'timestamp' must be a number of seconds, got False"),
    ({"parent_chat_id": 2**63}, "field 'parent_chat_id' is 9223372036854775808, out of range"),
    ({"turn": -1}, "field 'turn' is negative"),
    ({"user_id": True}, "field 'user_id' must be a string or integer, got True"),
    ({"hash_ids": [2**64 - 1, -1]}, "field 'hash_ids' mixes a negative id (-1) with an id >= 2^63"),
    ({"hash_ids": [2**64]}, "field 'hash_ids' holds the id 18446744073709551616, out of range: ids are 64-bit"),
    ({"type": "[/x]", "input_length": "[/x]"}, "field 'input_length' must be an integer token count, got '[/x]'"),
])
def test_bad_values_name_line_and_field(tmp_path: Path, override: dict[str, object], needle: str) -> None:
    path = _write(tmp_path / "t.jsonl", [_req(1), _req(2, ts=1.0, **override), _req(3, ts=2.0)])
    _one_line_error([str(path), "-o", str(tmp_path / "run")], f"t.jsonl:2: {needle}")
    assert not (tmp_path / "run").exists()
    prov = ingest_trace(path, tmp_path / "skip", on_error="skip")
    assert prov["num_requests"] == 2 and prov["findings"] == {"skipped_lines": 1}


def test_nan_literal_names_the_field(tmp_path: Path) -> None:
    line = json.dumps(_req(2, ts=1.0)).replace('"timestamp": 1.0', '"timestamp": NaN')
    path = _write(tmp_path / "t.jsonl", [_req(1), line])
    _one_line_error([str(path), "-o", str(tmp_path / "run")], "t.jsonl:2: field 'timestamp' is nan, out of range")


def test_unsigned_ids_stay_distinct_and_a_mixed_domain_is_refused(tmp_path: Path) -> None:
    top = 2**64 - 1
    path = _write(tmp_path / "u.jsonl", [_req(1, hash_ids=[top, 2**63]), _req(2, ts=1.0, hash_ids=[top, 5]),
                                         _req(3, ts=2.0, hash_ids=[2**63, 1])])
    prov = ingest_trace(path, tmp_path / "u")
    assert prov["id_domain"] == "unsigned" and prov["num_distinct_blocks"] == 5
    blocks = RunDir(tmp_path / "u").blocks().sort("req_idx", "pos")
    assert blocks["block_id"].to_list() == [-1, -(2**63), -1, 5, -(2**63), 1]  # the 64-bit patterns
    assert blocks["chain_idx"].to_list() == [0, 1, 0, 2, 3, 4]
    neg = _write(tmp_path / "s.jsonl", [_req(1, hash_ids=[-1, 7]), _req(2, ts=1.0, hash_ids=[-5])])
    assert ingest_trace(neg, tmp_path / "s")["id_domain"] == "signed"
    mixed = _write(tmp_path / "m.jsonl", [_req(1, hash_ids=[-1]), _req(2, ts=1.0, hash_ids=[top])])
    _one_line_error([str(mixed), "-o", str(tmp_path / "m"), "--on-error", "skip"],
                    "m.jsonl:2: field 'hash_ids' has ids >= 2^63, but line 1 has negative ids")


def test_mixed_formats_are_refused_even_when_skipping(tmp_path: Path) -> None:
    moon = {"timestamp": 0, "input_length": 32, "output_length": 1, "hash_ids": [1, 2]}
    path = _write(tmp_path / "mix.jsonl", [moon, {**_req(1), "timestamp": 5}])
    _one_line_error([str(path), "-o", str(tmp_path / "a"), "--on-error", "skip"],
                    "mix.jsonl:2: field 'chat_id' belongs to a Bailian record, but line 1 made this a Mooncake")
    path = _write(tmp_path / "mix2.jsonl", [_req(1), moon])
    _one_line_error([str(path), "-o", str(tmp_path / "b")],
                    "mix2.jsonl:2: field 'chat_id' is missing: a Mooncake record, but line 1 made this a Bailian")


def test_a_trace_without_any_hash_id_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "e.jsonl", [_req(1, hash_ids=[]), _req(2, ts=1.0, hash_ids=[])])
    _one_line_error([str(path), "-o", str(tmp_path / "e")], "e.jsonl: no request has a hash id")


# ---- stale results -----------------------------------------------------------------------------------------
def test_reingest_of_other_content_is_refused_and_overwrite_clears_downstream(tmp_path: Path) -> None:
    from tongyi_trace.analysis import run_analyses
    from tongyi_trace.report import render_report

    a = _write(tmp_path / "a.jsonl", [_req(1), _req(2, ts=1.0, hash_ids=[10, 11])])
    b = _write(tmp_path / "b.jsonl", [_req(1), _req(2, ts=1.0), _req(3, ts=2.0)])
    run = tmp_path / "run"
    first = ingest_trace(a, run)
    run_analyses(RunDir(run), only="hit_ratio")
    render_report(RunDir(run))
    assert json.loads((run / "analysis" / "hit_ratio.json").read_text())["run_id"] == first["run_id"]
    again = ingest_trace(a, run)  # same content and options: same identity, results kept
    assert again["run_id"] == first["run_id"] and (run / "analysis" / "hit_ratio.json").is_file()
    msg = _one_line_error([str(b), "-o", str(run)], "already holds the run of another trace", "--overwrite")
    assert "analysis" in msg and (run / "analysis").is_dir()
    _one_line_error([str(a), "-o", str(run), "--block-size", "32"], "already holds the run")
    assert RunDir(run).provenance()["run_id"] == first["run_id"]
    second = ingest_trace(b, run, overwrite=True)
    assert second["run_id"] != first["run_id"] and second["num_requests"] == 3
    assert not (run / "analysis").exists() and not (run / "report.html").exists()


def test_an_artifact_of_another_identity_is_refused_by_its_readers(tmp_path: Path) -> None:
    from tongyi_trace.analysis import run_analyses
    from tongyi_trace.report import render_report

    run = tmp_path / "run"
    ingest_trace(_write(tmp_path / "a.jsonl", [_req(1), _req(2, ts=1.0, hash_ids=[10, 11])]), run)
    run_analyses(RunDir(run), only="hit_ratio")
    p = run / "analysis" / "hit_ratio.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "run_id": "0123456789abcdef"}))
    with pytest.raises(InputError, match=r"hit_ratio.json: was made from another ingest \(run_id 0123456789abcdef\)"):
        render_report(RunDir(run))
    r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "another ingest" in r.output


def test_default_run_folders_of_similar_names_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tongyi_trace.trace.ingest import default_run_dir

    assert default_run_dir(Path("x/conv.v2.jsonl")) != default_run_dir(Path("x/conv.jsonl"))
    assert default_run_dir(Path("x/conv.jsonl.zst")) == Path("conv.kvtrace")
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "conv.jsonl", [_req(1), _req(2, ts=1.0)])
    _write(tmp_path / "conv.v2.jsonl", [_req(1), _req(2, ts=1.0, hash_ids=[1, 2])])
    for name in ("conv.jsonl", "conv.v2.jsonl"):
        r = runner.invoke(app, ["analyze", name, "--only", "hit_ratio", "-q"])
        assert r.exit_code == 0, r.output
    assert pl.read_parquet(tmp_path / "conv.v2.kvtrace" / "blocks.parquet")["block_id"].to_list()[-2:] == [1, 2]


def test_markup_in_user_text_is_printed_verbatim(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [_req(1, type="[/x]"), _req(2, ts=1.0, type="[bold]x")])
    out = tmp_path / "t[/x]"
    r = runner.invoke(app, ["ingest", str(path), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "t[/x" in "".join(r.output.split())  # table titles wrap where the temp folder's name says
    r = runner.invoke(app, ["analyze", str(out), "--only", "request_mix"])
    assert r.exit_code == 0, r.output
    assert "t[/x" in "".join(r.output.split())


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_leading_byte_order_mark_is_ignored(tmp_path: Path, suffix: str) -> None:
    """A UTF-8 BOM before the first record (Notepad, PowerShell) reads as the same trace; it was refused
    as "the first record is not valid JSON"."""
    records: list[dict[str, object] | str] = [_req(1), _req(2, parent=1, ts=1.0, n=3, turn=2)]
    plain = ingest_trace(_write(tmp_path / "plain.jsonl", records), tmp_path / "plain")
    data = b"\xef\xbb\xbf" + _lines(records).encode()
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else
                     zstandard.ZstdCompressor().compress(data) if suffix.endswith(".zst") else data)
    bom = ingest_trace(path, tmp_path / "bom")
    for table in ("requests.parquet", "blocks.parquet"):
        assert pl.read_parquet(tmp_path / "bom" / table).equals(pl.read_parquet(tmp_path / "plain" / table))
    assert bom["num_block_refs"] == plain["num_block_refs"] == 5


def test_pipes_devices_and_link_loops_are_one_line(tmp_path: Path) -> None:
    """Issue 42 #13 and two unclear messages: a FIFO without a writer is refused at once (it blocked forever),
    /dev/stdin and /dev/zero are refused as what they are (a pipe was read twice and its valid JSONL refused;
    /dev/zero grew one line without bound), a symbolic link loop is named as such (it was "no such file")."""
    import os
    import stat

    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    out = str(tmp_path / "run")
    _one_line_error([str(fifo), "-o", out], "trace.jsonl: is a named pipe (FIFO), not a regular file; a trace is "
                    "read several times")
    _one_line_error(["/dev/zero", "-o", out], "/dev/zero: is a character device, not a regular file")
    stdin_kind = os.stat("/dev/stdin").st_mode  # a pipe or a terminal under pytest, never a regular file here
    if not stat.S_ISREG(stdin_kind):
        _one_line_error(["/dev/stdin", "-o", out], "/dev/stdin: is ")
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    _one_line_error([str(tmp_path / "a.jsonl"), "-o", out], "a.jsonl: a loop of symbolic links")
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing.jsonl")
    _one_line_error([str(tmp_path / "gone.jsonl"), "-o", out], "missing.jsonl, which does not exist")
    assert not Path(out).exists()


def test_a_refused_folder_gets_no_lock_file(tmp_path: Path) -> None:
    """Issue 42 #14: ingest into a folder of other files (or -o /) is refused and leaves no .kvtrace.lock."""
    good = _write(tmp_path / "t.jsonl", [_req(1), _req(2, ts=1.0)])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    _one_line_error([str(good), "-o", str(tmp_path / "busy")], "not a kvtrace run (notes.txt)")
    assert sorted(p.name for p in (tmp_path / "busy").iterdir()) == ["notes.txt"]
    had_lock = Path("/.kvtrace.lock").exists()
    _one_line_error([str(good), "-o", "/"], "/: holds files that are not a kvtrace run")
    assert Path("/.kvtrace.lock").exists() == had_lock


def test_parquet_duplicate_columns_and_dictionary_strings(tmp_path: Path) -> None:
    """A Parquet trace with the column chat_id twice is one line (it was a KeyError traceback); dictionary-
    encoded string columns (pandas categoricals) ingest to the same tables as plain strings (they were refused)."""
    ingest_trace(_write(tmp_path / "t.jsonl", [_req(1), _req(2, ts=1.0)]), tmp_path / "run")
    good = tmp_path / "t.parquet"
    assert runner.invoke(app, ["export", str(tmp_path / "run"), "-o", str(good), "-q"]).exit_code == 0
    table = pq.read_table(good)
    twice = pa.Table.from_arrays([*table.columns, table.column("chat_id")], names=[*table.column_names, "chat_id"])
    pq.write_table(twice, tmp_path / "twice.parquet")
    _one_line_error([str(tmp_path / "twice.parquet"), "-o", str(tmp_path / "a")],
                    "twice.parquet: column 'chat_id' appears 2 times")
    i = table.schema.get_field_index("type")
    pq.write_table(table.set_column(i, "type", pc.dictionary_encode(table.column("type"))), tmp_path / "dict.parquet",
                   use_dictionary=True)
    assert pq.read_schema(tmp_path / "dict.parquet").field("type").type == pa.dictionary(pa.int32(), pa.string())
    ingest_trace(tmp_path / "dict.parquet", tmp_path / "b")
    assert RunDir(tmp_path / "b").requests().drop("type").equals(RunDir(tmp_path / "run").requests().drop("type"))
    assert RunDir(tmp_path / "b").requests()["type"].to_list() == ["text", "text"]


def test_a_line_without_end_is_refused_at_the_cap(tmp_path: Path) -> None:
    """Issue 42: a file of zeros (here sparse, 65 MiB, no newline) was read into one line without bound (a
    MemoryError under a limit); now one line past 64 MiB."""
    from tongyi_trace.trace.source import MAX_LINE_BYTES

    zeros = tmp_path / "zeros.jsonl"
    with zeros.open("wb") as f:
        f.truncate(MAX_LINE_BYTES + (1 << 20))
    _one_line_error([str(zeros), "-o", str(tmp_path / "run")], "zeros.jsonl: a line longer than 64 MiB")

"""The run folder under concurrent or careless use: an exclusive writer lock, unique temporary names with
atomic renames, strictly valid JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tongyi_trace.atomic import temp_path
from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.run import RunDir, atomic_write_text, run_lock, write_json
from tongyi_trace.trace.ingest import ingest_trace

runner = CliRunner()
HOLD = "import sys, time; from pathlib import Path; from tongyi_trace.run import run_lock\n" \
       "with run_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(60)\n"


def test_a_second_writer_is_told_which_pid_holds_the_folder(tiny_bailian_path: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ingest_trace(tiny_bailian_path, run)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for args in (["ingest", str(tiny_bailian_path), "-o", str(run), "-q"],
                     ["analyze", str(run), "--only", "hit_ratio", "-q"], ["report", str(run), "-q"]):
            r = runner.invoke(app, args)
            assert r.exit_code == 2, r.output
            assert f"in use by pid {holder.pid}" in r.output and r.output.count("\n") == 1, r.output
    finally:
        holder.kill()
        holder.communicate()  # reaps it and closes the pipe
    # the lock dies with its holder: the folder is usable again
    assert runner.invoke(app, ["analyze", str(run), "--only", "hit_ratio", "-q"]).exit_code == 0


def test_the_lock_is_reentrant_within_one_process(tmp_path: Path) -> None:
    with run_lock(tmp_path), run_lock(tmp_path):
        pass
    with run_lock(tmp_path):  # released: taken again
        pass


def test_a_planted_lock_symlink_is_refused_and_its_target_kept(tiny_bailian_path: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ingest_trace(tiny_bailian_path, run)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    (run / ".kvtrace.lock").unlink()
    (run / ".kvtrace.lock").symlink_to(precious)
    res = runner.invoke(app, ["analyze", str(run), "--only", "hit_ratio", "-q"])
    assert res.exit_code == 2 and "is a symbolic link, not kvtrace's lock file" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert precious.read_text() == "keep me\n"  # before: truncated to 0 bytes
    with pytest.raises(InputError, match="symbolic link"), run_lock(run):
        pass


def test_temporary_names_are_unique_and_nothing_is_left_behind(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    assert len({temp_path(target) for _ in range(100)}) == 100
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    with pytest.raises(InputError, match=r"nowhere/a.json: cannot write"):
        atomic_write_text(tmp_path / "nowhere" / "a.json", "x")


def test_json_is_strict_nan_and_infinity_become_null(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    write_json(p, {"nan": float("nan"), "inf": [math.inf, np.float64("-inf")], "ok": np.float32(1.5),
                   "n": np.int64(3), "nested": {"v": (float("nan"), 2)}})
    doc = json.loads(p.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert doc == {"nan": None, "inf": [None, None], "ok": 1.5, "n": 3, "nested": {"v": [None, 2]}}


def test_artifacts_inside_a_run_are_stamped(tiny_bailian_path: Path, tmp_path: Path) -> None:
    prov = ingest_trace(tiny_bailian_path, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    write_json(run.subdir("replay") / "summary.json", {"schema": "x"})
    assert json.loads((tmp_path / "run" / "replay" / "summary.json").read_text())["run_id"] == prov["run_id"]
    assert run.read_artifact(tmp_path / "run" / "replay" / "summary.json", "x") is not None
    # in a set folder (sim/) a document no command committed is refused: no manifest.json lists it
    write_json(run.subdir("sim") / "summary.json", {"schema": "x"})
    with pytest.raises(InputError, match=r"sim incomplete \(no manifest.json.*rerun kvtrace simulate"):
        run.read_artifact(tmp_path / "run" / "sim" / "summary.json", "x")
    write_json(tmp_path / "outside.json", {"schema": "x"})
    assert "run_id" not in json.loads((tmp_path / "outside.json").read_text())


@pytest.mark.parametrize("table", ["provenance.json", "requests.parquet", "blocks.parquet"])
def test_no_command_writes_over_a_run_table(tiny_bailian_path: Path, tmp_path: Path, table: str) -> None:
    """-o naming one of a run folder's own tables is refused in one line, and the file is left as it was."""
    run = tmp_path / "run"
    ingest_trace(tiny_bailian_path, run)
    target = run / table
    before = target.read_bytes()
    for args in (["export", str(run), "-o", str(target), "-q"], ["report", str(run), "-o", str(target), "-q"],
                 ["synth", "--profile", "to-c", "--scale", "0.0001", "-o", str(target), "-q"],
                 ["fit", str(run), "-o", str(target), "-q"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.count("\n") == 1 and f"is the run folder's own {table}" in r.output, (args, r.output)
        assert target.read_bytes() == before, args
    assert runner.invoke(app, ["export", str(run), "-o", str(run / "copy.parquet"), "-q"]).exit_code == 0


@pytest.mark.parametrize(("table", "content", "needle"), [
    ("blocks.parquet", None, "not a kvtrace blocks table (no columns req_idx, pos, block_id"),
    ("requests.parquet", None, "not a kvtrace requests table (no columns req_idx, session_id"),
    ("blocks.parquet", b"not parquet", "not a readable Parquet table"),
])
def test_a_damaged_run_table_is_one_line(tiny_bailian_path: Path, tmp_path: Path, table: str,
                                        content: bytes | None, needle: str) -> None:
    """A table replaced by another file (an exported trace, say) stops every command at open, in one line."""
    run = tmp_path / "run"
    ingest_trace(tiny_bailian_path, run)
    if content is None:  # an exported trace written where the table was: a Parquet file of other columns
        assert runner.invoke(app, ["export", str(run), "-o", str(tmp_path / "trace.parquet"), "-q"]).exit_code == 0
        (run / table).write_bytes((tmp_path / "trace.parquet").read_bytes())
    else:
        (run / table).write_bytes(content)
    for args in (["simulate", str(run), "-p", "lru", "-c", "2", "-q"], ["analyze", str(run), "-q"],
                 ["fit", str(run), "-q"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.count("\n") == 1 and needle in r.output and "Traceback" not in r.output, (args, r.output)

"""Crash consistency (issue 42 item 2): each writing command killed with SIGKILL after its N-th committed write.

Replay (against the in-process stand-in server of tongyi_trace/replay/standin.py, no engine) counts each
record appended to records.jsonl as a committed write: killed mid-dispatch, a new replay is left partial
(whole lines only, its summary "running", which report and compare say), and a replay with --overwrite
leaves the old one whole (the new one is written aside and committed at its end).

The kill points come from tracing the command's writes on the tiny trace (the test hook of
tongyi_trace/atomic.py: KVTRACE_WRITE_LOG lists the committed writes, KVTRACE_CRASH_AFTER_WRITES=N makes the
command SIGKILL itself right after the N-th). After each kill, the next command's start (the run lock, which
runs artifact_set.recover) must leave: the previous good state byte for byte, or the new one complete (every
file the uninterrupted command writes, its manifest listing exactly them); no temporary, staging or journal
file; a report that renders. The fast lane kills each command right before its commit point (the journal)
and half-way through applying it (a replay also mid-dispatch); `full` kills it after every write (at most
MAX_FULL_POINTS, evenly spread). Measured (each test prints its points and the state each left): 17 kill points
in the fast lane (make test), 83 in the full lane (make test-all), with
`python -m pytest tests/hardening/test_crash.py -p no:xdist -s` (both lanes: 23 tests, about 15 minutes on 2
shared cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tongyi_trace.artifact_set import JOURNAL_NAME, MANIFEST_NAME
from tongyi_trace.cli import app
from tongyi_trace.errors import InputError
from tongyi_trace.replay.standin import StandInState, serve
from tongyi_trace.run import open_run, run_lock

pytestmark = pytest.mark.slow
runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
MAX_FULL_POINTS = 12
REPLAY_ARGS = ["--speedup", "1000", "--max-in-flight", "1", "-q"]
LEFTOVER = re.compile(r"(^\.staging\.|^\.trash\.|\.tmp(\.[^.]*)?$|^duckdb-)")


def _cli(args: list[str]) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 0, (args, r.output)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """The stand-in OpenAI-compatible server (NOT vLLM) the replays of the module talk to: its URL."""
    state = StandInState(block_size=16)
    httpd = serve(state)
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    state.stop.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_bailian_path: Path, upstream: str) -> dict[str, Any]:
    """A complete run of the tiny trace (ingest, analyze, fit, simulate with WA, a replay named r, report), a
    second trace and an exported file: the previous good state every case starts from."""
    d = tmp_path_factory.mktemp("crash")
    run = d / "run"
    _cli(["ingest", str(tiny_bailian_path), "-o", str(run), "-q"])
    _cli(["analyze", str(run), "-q"])
    _cli(["fit", str(run), "-q"])
    _cli(["simulate", str(run), "-p", "lru,wa", "-c", "0.5x,1x", "--jobs", "1", "-q"])
    _cli(["replay", str(run), "--server", upstream, "--name", "r", *REPLAY_ARGS])
    _cli(["report", str(run), "-q"])
    other = d / "other.jsonl"  # another trace: its first five requests
    other.write_text("".join(tiny_bailian_path.read_text().splitlines(keepends=True)[:5]))
    (d / "old_export.jsonl").write_text('{"an": "earlier export"}\n')
    return {"dir": d, "run": run, "trace": tiny_bailian_path, "other": other, "server": upstream}


@dataclass(frozen=True)
class Case:
    """One command of the harness: its arguments in the work folder W, and the folder it replaces."""

    name: str
    args: Callable[[Path, dict[str, Any]], list[str]]
    target: str  # what the command replaces: a path under W ("run/analysis", "run", "new", "out.jsonl")


CASES = [
    Case("ingest", lambda w, b: ["ingest", str(b["trace"]), "-o", str(w / "new"), "-q"], "new"),
    Case("ingest-overwrite", lambda w, b: ["ingest", str(b["other"]), "-o", str(w / "run"), "--overwrite", "-q"],
         "run"),
    Case("analyze", lambda w, b: ["analyze", str(w / "run"), "-q"], "run/analysis"),
    Case("fit", lambda w, b: ["fit", str(w / "run"), "--life-quantile", "0.5", "-q"], "run/fit"),
    Case("simulate", lambda w, b: ["simulate", str(w / "run"), "-p", "lru", "-c", "0.5x,1x", "--jobs", "1", "-q"],
         "run/sim"),
    Case("report", lambda w, b: ["report", str(w / "run"), "-q"], "run/report.html"),
    Case("export", lambda w, b: ["export", str(w / "run"), "-o", str(w / "out.jsonl"), "--force", "-q"],
         "out.jsonl"),
    Case("replay", lambda w, b: ["replay", str(w / "run"), "--server", b["server"], "--name", "new", *REPLAY_ARGS],
         "run/replay/new"),
    Case("replay-overwrite", lambda w, b: ["replay", str(w / "run"), "--server", b["server"], "--name", "r",
                                           "--overwrite", *REPLAY_ARGS], "run/replay/r"),
]
REPLAYS = ("replay", "replay-overwrite")
# the states the fast lane's kill points leave (kill_points: the fast ones, in order)
FAST_STATES = {"replay": ["partial", "new"], "replay-overwrite": ["old", "old", "new"]}


def _workdir(base: dict[str, Any], dest: Path) -> Path:
    shutil.copytree(base["run"], dest / "run")
    shutil.copy(base["dir"] / "old_export.jsonl", dest / "out.jsonl")
    return dest


def _snapshot(root: Path) -> dict[str, str]:
    """sha256 of every visible file under ROOT (the lock file aside), by relative path."""
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not any(s.startswith(".") for s in
                                                                         p.relative_to(root).parts)}


def _leftovers(work: Path) -> list[str]:
    return [str(p.relative_to(work)) for p in work.rglob("*")
            if LEFTOVER.search(p.name) or p.name == JOURNAL_NAME]


@pytest.fixture(scope="module")
def reference(base: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """Each case run uninterrupted on a copy of the base, traced: (its work folder, its committed writes)."""
    out = {}
    for case in CASES:
        work = _workdir(base, tmp_path_factory.mktemp(f"ref-{case.name}"))
        log = work / "writes.log"
        os.environ["KVTRACE_WRITE_LOG"] = str(log)  # in this process: the hook reads it at each write
        try:
            _cli(case.args(work, base))
        finally:
            del os.environ["KVTRACE_WRITE_LOG"]
        out[case.name] = (work, [line.split("\t", 1)[1] for line in log.read_text().splitlines()])
    return out


def kill_points(writes: list[str], full: bool) -> list[int]:
    """Fast: right before the commit point (the journal) and right after the first file moved in (a commit
    half applied, which the next command completes); a single-file write: after it; a replay: also in the
    middle of its dispatch (after its third record).
    FULL: after every write (at most MAX_FULL_POINTS evenly spread, plus the fast ones and the journal's)."""
    journal = [i for i, w in enumerate(writes, 1) if w.endswith(JOURNAL_NAME)]
    records = [i for i, w in enumerate(writes, 1) if w.endswith("records.jsonl")]
    fast = [journal[0] - 1, min(journal[0] + 1, len(writes))] if journal else [len(writes)]
    if records:
        fast = [records[2], *fast]
    if not full:
        return fast
    n = len(writes)
    spread = {1 + round(i * (n - 1) / (MAX_FULL_POINTS - 1)) for i in range(MAX_FULL_POINTS)} if n > MAX_FULL_POINTS \
        else set(range(1, n + 1))
    return sorted(spread | set(fast) | set(journal))


def _check_replay_after_kill(case: Case, work: Path, base: dict[str, Any], ref_work: Path,
                             num_records: int) -> str:
    """A replay killed after NUM_RECORDS records: the old replay whole, or the new one complete, or (a new
    name) a partial one of whole lines that report and compare call unfinished. Returns 'old', 'new' or
    'partial'."""
    run = work / "run"
    with run_lock(run):  # the next command's start
        pass
    target, old = work / case.target, base["dir"] / case.target
    latest = _snapshot(run / "replay" / "cost_model.json")
    rest = {k: v for k, v in _snapshot(run).items() if not k.startswith("replay/")}
    assert rest == {k: v for k, v in _snapshot(base["run"]).items() if not k.startswith("replay/")}
    assert _leftovers(work) == [], case.name
    others = {k: v for k, v in _snapshot(run / "replay").items() if not k.startswith(target.name + "/")}
    base_others = {k: v for k, v in _snapshot(base["run"] / "replay").items() if not k.startswith(target.name + "/")}
    if target.is_dir() and _snapshot(target) == _snapshot(old):
        assert others == base_others  # the run's latest cost model too
        return "old"
    summary = json.loads((target / "summary.json").read_text())
    text = (target / "records.jsonl").read_text() if (target / "records.jsonl").is_file() else ""
    lines = text.splitlines()
    assert text == "" or text.endswith("\n"), text[-200:]  # whole lines only
    assert [json.loads(line)["status"] for line in lines] == ["ok"] * num_records
    if summary["status"] == "complete":
        assert sorted(_snapshot(target)) == sorted(_snapshot(ref_work / case.target)), case.name
        assert summary["counts"]["num_ok"] == len(lines) == 6
        cost = json.loads((run / "replay" / "cost_model.json").read_text())
        if cost != json.loads((base["run"] / "replay" / "cost_model.json").read_text()):  # a kill before its copy
            assert cost == {**json.loads((target / "cost_model.json").read_text()), "replay": target.name}
        else:
            assert case.name == "replay"  # an overwrite commits the replay and the run's copy together
        return "new"
    assert case.name == "replay" and summary["status"] == "running", (case.name, summary["status"])
    assert others == base_others and latest == _snapshot(base["run"] / "replay" / "cost_model.json")
    r = runner.invoke(app, ["report", str(run), "-o", str(work / "check.html"), "-q"])
    assert r.exit_code == 0, r.output
    page = (work / "check.html").read_text()
    assert "never finished (killed)" in page and f"{num_records} requests recorded" in page
    c = runner.invoke(app, ["compare", str(run / "replay" / "r"), str(target), "-o", str(work / "c.json")])
    assert c.exit_code == 0, c.output
    assert "replay B (new) never finished: its summary says 'running'" in " ".join(c.output.split())
    assert "replay B (new) never finished" in " ".join(json.loads((work / "c.json").read_text())["notes"])
    return "partial"


def _check_after_kill(case: Case, work: Path, base: dict[str, Any], ref_work: Path) -> str:
    """Take the lock as the next command does, then: previous state identical, or the new one complete.
    Returns 'old' or 'new'."""
    target, old, new = work / case.target, _workdir_target(base, case), ref_work / case.target
    if case.name == "ingest":
        if not target.exists():
            return "old"
        with run_lock(target):
            pass
        try:
            open_run(target)
        except InputError as e:  # the new run was never committed: the folder is no run, in one line
            assert "not a kvtrace run folder" in str(e)
            state = "old"
        else:
            assert _snapshot(target / "requests.parquet") == _snapshot(new / "requests.parquet")
            assert _snapshot(target / "blocks.parquet") == _snapshot(new / "blocks.parquet")
            state = "new"
    else:
        with run_lock(work / "run"):  # the next command's start
            pass
        now = _snapshot(target)
        if now == _snapshot(old):
            state = "old"
        else:
            state = "new"
            assert sorted(now) == sorted(_snapshot(new)), case.name  # every file of the new set, no other
            if target.is_dir() and case.name != "ingest-overwrite":
                manifest = json.loads((target / MANIFEST_NAME).read_text())
                assert manifest["files"] == sorted(p for p in now if p != MANIFEST_NAME and "/" not in p)
                assert manifest["run_id"] == json.loads((work / "run" / "provenance.json").read_text())["run_id"]
            if case.name in ("ingest-overwrite", "export"):  # deterministic outputs: byte for byte
                assert {k: v for k, v in now.items() if k != "report.html"} == \
                    {k: v for k, v in _snapshot(new).items() if k != "report.html"}
        if case.target.startswith("run/"):  # nothing outside the replaced set changed
            rest = {k: v for k, v in _snapshot(work / "run").items() if not k.startswith(case.target[4:])}
            assert rest == {k: v for k, v in _snapshot(base["run"]).items() if not k.startswith(case.target[4:])}
    assert _leftovers(work) == [], case.name
    run = work / "new" if case.name == "ingest" else work / "run"
    if (run / "provenance.json").is_file():  # the report renders what is there, never a partial set
        r = runner.invoke(app, ["report", str(run), "-o", str(work / "check.html"), "-q"])
        assert r.exit_code == 0, (case.name, r.output)
    return state


def _workdir_target(base: dict[str, Any], case: Case) -> Path:
    if case.target == "out.jsonl":
        return base["dir"] / "old_export.jsonl"
    if case.target == "new":
        return base["dir"] / "no-such-folder"
    return base["dir"] / case.target


def _run_case(case: Case, base: dict[str, Any], reference: dict[str, tuple[Path, list[str]]], tmp_path: Path,
              full: bool) -> list[tuple[int, str]]:
    ref_work, writes = reference[case.name]
    outcomes = []
    for k in kill_points(writes, full):
        work = _workdir(base, tmp_path / f"{case.name}-{k}")
        r = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", *case.args(work, base)],
                           env={**os.environ, "KVTRACE_CRASH_AFTER_WRITES": str(k)}, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == -signal.SIGKILL, (case.name, k, r.returncode, r.stderr[-2000:])
        if case.name in REPLAYS:
            dispatch = writes[:k][:next((i for i, w in enumerate(writes) if w.endswith(JOURNAL_NAME)), None)]
            num_records = sum(w.endswith("records.jsonl") for w in dispatch)  # (not the commit's move)
            outcomes.append((k, _check_replay_after_kill(case, work, base, ref_work, num_records)))
        else:
            outcomes.append((k, _check_after_kill(case, work, base, ref_work)))
    print(f"\n{case.name}: {len(writes)} writes, killed after {outcomes}")
    return outcomes


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_killed_command_leaves_old_or_new(case: Case, base: dict[str, Any],
                                          reference: dict[str, tuple[Path, list[str]]], tmp_path: Path) -> None:
    outcomes = _run_case(case, base, reference, tmp_path, full=False)
    states = [s for _, s in outcomes]
    if case.name in FAST_STATES:
        assert states == FAST_STATES[case.name], outcomes
    elif len(states) == 2:  # killed before the commit point: the old state; right after: the new one, completed
        assert states == ["old", "new"], outcomes
    else:
        assert states == ["new"], outcomes


@pytest.mark.full
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_killed_after_every_write(case: Case, base: dict[str, Any], reference: dict[str, tuple[Path, list[str]]],
                                  tmp_path: Path) -> None:
    _run_case(case, base, reference, tmp_path, full=True)


def _file_size_limit(num_bytes: int) -> Callable[[], None]:
    def limit() -> None:  # in the child: writes past NUM_BYTES fail with EFBIG, as on a full disk (no SIGXFSZ)
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (num_bytes, num_bytes))
    return limit


@pytest.mark.parametrize("limit_bytes", [4_000, 10_000])  # results.jsonl cut / results.parquet (14 kB) cut
def test_a_full_disk_during_simulate_is_one_line_and_keeps_the_old_sweep(base: dict[str, Any], tmp_path: Path,
                                                                         limit_bytes: int) -> None:
    """Issue 42: a disk that fills up during simulate was a 67-line polars traceback and left sim/ without
    summary.json; now one line, exit 1, and the previous sweep stays whole."""
    work = _workdir(base, tmp_path)
    r = subprocess.run([sys.executable, "-m", "tongyi_trace.cli", "simulate", str(work / "run"), "-p", "lru,wa",
                        "-c", "0.5x,1x", "--jobs", "1", "-q"], preexec_fn=_file_size_limit(limit_bytes),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "cannot write (file too large for the file system or the file size limit); the previous results " \
        "are kept" in r.stderr
    assert _snapshot(work / "run" / "sim") == _snapshot(base["run"] / "sim")
    with run_lock(work / "run"):  # the next command's start removes the staged half
        pass
    assert _leftovers(work) == []


def test_a_sweep_without_wa_leaves_no_guard_tables(base: dict[str, Any],
                                                   reference: dict[str, tuple[Path, list[str]]]) -> None:
    """Issue 42 #4: `simulate -p wa` then `simulate -p lru` kept the first sweep's guard tables, and the report
    showed a guard section for a sweep without WA. The committed set replaces the whole folder."""
    assert (base["run"] / "sim" / "guard_timeline.parquet").is_file()  # the base sweep ran WA
    sim = reference["simulate"][0] / "run" / "sim"
    assert not list(sim.glob("guard_*.parquet"))
    assert json.loads((sim / MANIFEST_NAME).read_text())["files"] == sorted(
        p.name for p in sim.iterdir() if p.is_file() and p.name != MANIFEST_NAME)


def test_leftovers_of_a_killed_command_go_at_the_next_start(base: dict[str, Any], tmp_path: Path) -> None:
    """Issue 42 #5/#6: temporary files of atomic writes (8 MB of .blocks.parquet.*.tmp.parquet), DuckDB spill
    folders (analysis/duckdb-*), staging folders and a cut journal are removed when the next command locks the
    run; the artifacts and a file of the user's stay."""
    run = _workdir(base, tmp_path) / "run"
    planted = [run / ".blocks.parquet.123.456.0badc0de.tmp.parquet", run / "analysis" / "duckdb-x1y2",
               run / "sim" / ".summary.json.9.9.12345678.tmp.json", run / ".staging.77.deadbeef",
               run / JOURNAL_NAME]
    (run / "sim" / "notes.txt").write_text("mine")
    before = _snapshot(run)
    for p in planted:
        if p.name.startswith((".staging.", "duckdb-")):
            p.mkdir()
            (p / "spill.tmp").write_bytes(b"x" * 1000)
        else:
            p.write_text("{cut")
    with run_lock(run):
        pass
    assert [p for p in planted if p.exists()] == []
    assert _snapshot(run) == before


def test_report_refuses_a_set_that_was_never_committed(base: dict[str, Any], tmp_path: Path) -> None:
    """Issue 42 #6: after a kill during analyze, report built from 7 of 28 figures and exited 0. A set folder
    without its manifest (an older kvtrace, or a copy cut short) is refused in one line saying what to rerun."""
    run = _workdir(base, tmp_path) / "run"
    (run / "analysis" / MANIFEST_NAME).unlink()
    r = runner.invoke(app, ["report", str(run), "-o", str(tmp_path / "r.html"), "-q"])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.output.split())
    assert f"{run / 'analysis'}: analysis incomplete (no manifest.json" in msg
    assert msg.endswith(f"rerun kvtrace analyze {run}") and not (tmp_path / "r.html").exists()

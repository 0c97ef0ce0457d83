"""Numeric and path options of ingest/analyze/replay/report: a value out of range is exit 2 and one line
naming the option, before anything is written."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tongyi_trace.cli import app
from tongyi_trace.replay.standin import StandInState, serve

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tiny_bailian_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tongyi_trace.trace.ingest import ingest_trace

    out = tmp_path_factory.mktemp("opts") / "run"
    ingest_trace(tiny_bailian_path, out)
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    state = StandInState()
    httpd = serve(state)
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _one_line(args: list[str], needle: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and needle in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize(("extra", "needle"), [
    (["--request-timeout-s", "0"], "--request-timeout-s 0.0"),
    (["--request-timeout-s", "-1"], "--request-timeout-s -1.0"),
    (["--request-timeout-s", "nan"], "--request-timeout-s nan"),
    (["--min-token-id", "-5"], "--min-token-id -5"),
    (["--duration", "nan"], "--duration nan"),
    (["--speedup", "inf"], "--speedup inf"),
    (["--start", "-3"], "--start -3.0"),
    (["--seed", "-1"], "--seed -1"),
    (["--sample-sessions", "nan"], "--sample-sessions nan"),
    (["--engine-block-size", "0"], "--engine-block-size 0"),
    (["--engine-num-blocks", "-4"], "--engine-num-blocks -4"),
    (["--vocab-size", "1"], "--vocab-size 1"),
])
def test_replay_options(run_dir: Path, server: str, extra: list[str], needle: str) -> None:
    _one_line(["replay", str(run_dir), "--server", server, "--name", "x", *extra], needle)
    assert not (run_dir / "replay" / "x").exists()


def test_replay_server_urls(run_dir: Path) -> None:
    _one_line(["replay", str(run_dir), "--server", "http://[::1"], "not a valid URL")
    _one_line(["replay", str(run_dir), "--server", "localhost:8000"], "not a valid URL")


def test_a_server_that_never_answers_is_not_called_unreachable(run_dir: Path) -> None:
    with socket.socket() as s:  # accepts connections (backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        r = runner.invoke(app, ["replay", str(run_dir), "--server", f"http://127.0.0.1:{port}", "--name", "h"])
    assert r.exit_code == 3 and "did not answer GET /v1/models within 10 s" in r.output, r.output


@pytest.mark.parametrize(("flag", "value"), [("--gpu-util", "2"), ("--gpu-util", "0"), ("--gpu-mem-gib", "nan"),
                                             ("--reserve-gib", "-1"), ("--params-b", "inf")])
def test_analyze_model_options(run_dir: Path, flag: str, value: str) -> None:
    _one_line(["analyze", str(run_dir), flag, value, "-q"], flag if flag != "--params-b" else "num_params")


def test_report_and_fit_style_paths(run_dir: Path, tmp_path: Path, tiny_bailian_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a trace given where a run is expected is ingested beside the working folder
    _one_line(["report", str(run_dir), "-o", str(tmp_path)], "is a folder")
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    _one_line(["analyze", str(tiny_bailian_path), "-o", str(copy / "requests.parquet"), "-q"],
              "exists and is not a folder")

"""A real local Ray cluster for the executor and study tests, and tiny synthetic runs.

`ray start --head --block` runs as a child in its own process group (so stopping it ends exactly the
processes it started, not every Ray process of the machine, as `ray stop` would); tests connect by address.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

import pytest

START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def ray_head(num_cpus: int = 2) -> Iterator[tuple[str, int]]:
    """A Ray head on 127.0.0.1 in its own process group: yields (address, process group id)."""
    ray_bin = Path(sys.executable).with_name("ray")
    port = _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="kvr"))  # short: Ray's socket paths must fit in 107 bytes
    log = tmp / "ray-start.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(ray_bin), "start", "--head", "--block", "--num-cpus", str(num_cpus),
                                 "--port", str(port), "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
                                 "--include-dashboard", "false", "--temp-dir", str(tmp)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_auth() -> Iterator[None]:
    """Token authentication with a token of this test session only (not ~/.ray/auth_token); set before Ray
    is imported (it reads RAY_AUTH_* then). Skips when Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed: pip install -e '.[ray]' (make test installs it)")
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def make_ray_head(ray_auth: None) -> Callable[..., AbstractContextManager[tuple[str, int]]]:
    """ray_head(num_cpus=2): a context manager starting a Ray head of the test's own."""
    return ray_head


@pytest.fixture(scope="session")
def ray_address(ray_auth: None) -> Iterator[str]:
    """Address of a 2-CPU Ray head started for this test session (skips when Ray is not installed)."""
    with ray_head() as (address, _pgid):
        yield address


def _make_trace(folder: Path, seed: int, num_requests: int = 400, duration_s: float = 400.0) -> Path:
    from tongyi_trace.trace.synth import synth_to_file

    path = folder / f"toc-s{seed}.jsonl"
    synth_to_file("to-c", seed, path, num_requests=num_requests, duration_s=duration_s)
    return path


@pytest.fixture(scope="session")
def make_trace() -> Callable[..., Path]:
    """make_trace(folder, seed, num_requests=400, duration_s=400): a small to-C trace (`kvtrace synth`'s
    generator) written into FOLDER."""
    return _make_trace


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 400-request synthetic to-C trace, ingested."""
    from tongyi_trace.trace.ingest import ingest_trace

    folder = tmp_path_factory.mktemp("tiny_run")
    run = folder / "run"
    ingest_trace(_make_trace(folder, seed=3), run)
    return run

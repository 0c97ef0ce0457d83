"""Fixtures of the capture tests: a small in-process OpenAI-compatible upstream (aiohttp, its own thread) whose
behaviour is chosen by a path prefix (http://HOST:PORT/MODE), and `kvtrace capture` run as a child process,
as a user runs it (first stdout line: its URL; SIGTERM stops it; --json: the summary after the URL)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

KVTRACE = [sys.executable, "-m", "tongyi_trace.cli"]
# The upstream's fake tokenizer: a text's token ids are its characters' code points (shared with the tests).
MODES = ("ok", "500", "garbage", "cut", "nousage", "notokenize", "slow", "slowtokenize", "lateend")
SLOW_S = 1.5  # how long the "slow" upstream thinks before it answers
SLOW_TOKENIZE_S = 0.4  # how long the "slowtokenize" upstream's /tokenize takes (its completions answer at once)


def fake_token_ids(text: str) -> list[int]:
    """What the fake upstream's /tokenize answers for TEXT."""
    return [ord(c) for c in text]


def _prompt_ids(body: dict[str, Any]) -> list[int]:
    if "messages" in body:
        return fake_token_ids("".join(str(m.get("content")) for m in body["messages"]))
    p = body["prompt"]
    return fake_token_ids(p) if isinstance(p, str) else list(p)


@dataclass
class FakeUpstream:
    """The running fake upstream: its base URL and every request it received (path, headers, body bytes)."""

    base: str
    received: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    def url(self, mode: str) -> str:
        """The base URL to give `kvtrace capture --upstream` for MODE (MODES)."""
        return f"{self.base}/{mode}"


def _app(state: FakeUpstream) -> web.Application:
    async def tokenize(request: web.Request) -> web.Response:
        if request.match_info["mode"] == "notokenize":
            return web.json_response({"detail": "Not Found"}, status=404)
        if request.match_info["mode"] == "slowtokenize":
            await asyncio.sleep(SLOW_TOKENIZE_S)
        body = await request.json()
        ids = _prompt_ids(body)
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": 4096})

    async def models(request: web.Request) -> web.Response:
        state.received.append((request.path, dict(request.headers), b""))
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]},
                                 headers={"X-Upstream": "models"})

    async def complete(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        state.received.append((request.path, dict(request.headers), raw))
        mode = request.match_info["mode"]
        if mode == "500":
            return web.Response(status=500, body=b'{"error": {"message": "engine fell over", "code": 500}}',
                                content_type="application/json", headers={"X-Upstream": "500"})
        if mode == "slow":
            await asyncio.sleep(SLOW_S)
        if mode == "garbage":
            return web.Response(status=200, body=b"this is {not json", content_type="application/json")
        body = json.loads(raw)
        chat = request.path.endswith("/chat/completions")
        prompts = body["prompt"] if not chat and isinstance(body["prompt"], list) and body["prompt"] \
            and isinstance(body["prompt"][0], str | list) else [body.get("prompt")]
        num_prompt = sum(len(_prompt_ids({**body, "prompt": p} if not chat else body)) for p in prompts)
        n_out = int(body.get("max_tokens", 3))
        usage = {"prompt_tokens": num_prompt, "completion_tokens": n_out * len(prompts),
                 "total_tokens": num_prompt + n_out * len(prompts)}
        if not body.get("stream"):
            choices = [{"index": i, "text": "x" * n_out, "finish_reason": "length"} for i in range(len(prompts))]
            doc: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "choices": choices}
            if mode != "nousage":
                doc["usage"] = usage
            return web.json_response(doc)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": "stream"})
        await resp.prepare(request)
        if chat:  # a chat stream opens with the role (no token)
            role = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            await resp.write(b"data: " + json.dumps(role).encode() + b"\n\n")
        for k in range(n_out):
            for i in range(len(prompts)):
                choice = ({"index": i, "delta": {"content": f"w{k}"}} if chat else {"index": i, "text": f"w{k}"})
                await resp.write(b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n")
            if mode == "cut" and k == 1:
                assert request.transport is not None
                request.transport.close()  # the upstream dies mid-stream
                return resp
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if mode == "lateend":  # the stream's chunked end comes late (a client may have left by then)
            await asyncio.sleep(0.3)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/{mode}/tokenize", tokenize)
    app.router.add_get("/{mode}/v1/models", models)
    app.router.add_post("/{mode}/v1/completions", complete)
    app.router.add_post("/{mode}/v1/chat/completions", complete)
    return app


@pytest.fixture(scope="session")
def fake_upstream() -> Iterator[FakeUpstream]:
    """The fake upstream, running in its own thread for the whole session."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        state = FakeUpstream(base="")
        runner = web.AppRunner(_app(state), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        holder.update(state=state, runner=runner)
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(30)
    yield holder["state"]
    asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    t.join(30)
    loop.close()


class Capture:
    """`kvtrace capture` as a child process: .url once it listens; .stop() sends SIGTERM and returns the
    summary it printed (--json)."""

    def __init__(self, upstream: str, out: Path, *args: str) -> None:
        self.out = out
        self.proc = subprocess.Popen([*KVTRACE, "capture", "--upstream", upstream, "-o", str(out), "--json", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.proc.kill()
            raise AssertionError(f"kvtrace capture did not start: {self.proc.communicate()[1][-1500:]}")

    def stop(self, sig: int = signal.SIGTERM) -> dict[str, Any]:
        """Stop it by SIG; the summary (kvtrace.capture-summary/1)."""
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err[-1500:]
        summary: dict[str, Any] = json.loads(out)
        return summary

    def kill(self) -> None:
        """Make sure the child is gone (teardown)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def start_capture() -> Iterator[Any]:
    """Factory: start_capture(upstream_url, out_path, *extra_args) -> Capture (stopped at teardown)."""
    started: list[Capture] = []

    def start(upstream: str, out: Path, *args: str) -> Capture:
        c = Capture(upstream, out, *args)
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The captured trace's records (plain, .gz or .zst)."""
    import gzip

    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    elif path.name.endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(raw).read()
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]

"""Capture proxy overhead for the note: TTFT P50/P99 and throughput at 50 requests/s, sent directly and through
`kvtrace capture` (a child process, as users run it), against the real CPU vLLM engine; and, to isolate the
proxy's own cost from the engine's noise, against an instant upstream (NOT vLLM: an aiohttp endpoint in a child
process of this script that streams 4 chunks and the usage at once). Target: the proxy adds <= 2 ms to TTFT
P99 at 50 requests/s.

Open loop: request i is sent at i / rate whatever happened before; short prompts (64 random token ids of the
engine's vocabulary, each request its own, so nothing is cached), 4 output tokens, streamed with usage. Direct
and proxied phases alternate (direct, proxy, proxy, direct, ...) so that both see the same machine; each phase
lasts --seconds. Then interleaved phases: request by request, both ways in the same phase at 50 requests/s in
total, so that both see the same machine and engine state. TTFT = the first streamed chunk with a choice - the
send time, as replay measures it (replay/dispatch.py).

Run: .venv/bin/python bench/bench_capture.py [--seconds 10] [--rounds 2] [--server URL] [--skip-engine]
(--serve-instant: run the instant upstream and print its URL; the script starts it so itself.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import psutil

from tongyi_trace import engine as eng
from tongyi_trace.engine.model import VOCAB_SIZE

RATE_PER_S = 50.0
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 4
TARGET_ADDED_P99_MS = 2.0
KVTRACE = [sys.executable, "-m", "tongyi_trace.cli"]


@dataclass
class Phase:
    """What one open-loop phase measured."""

    ttft_s: list[float] = field(default_factory=list)
    num_sent: int = 0
    num_ok: int = 0
    num_output_tokens: int = 0
    first_send: float = 0.0
    last_end: float = 0.0


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, phase: Phase) -> None:
    sent = time.perf_counter()
    ttft = None
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if ttft is None and chunk.get("choices"):
                    ttft = time.perf_counter() - sent
                if chunk.get("usage"):
                    phase.num_output_tokens += int(chunk["usage"].get("completion_tokens") or 0)
            ok = resp.status == 200 and ttft is not None
    except (aiohttp.ClientError, OSError, TimeoutError):
        ok = False
    phase.last_end = max(phase.last_end, time.perf_counter())
    if ok and ttft is not None:
        phase.num_ok += 1
        phase.ttft_s.append(ttft)


async def drive(bases: list[str], model: str, rate: float, seconds: float, seed: int) -> list[Phase]:
    """Send rate x seconds streamed completions at a constant total rate (open loop), request i to
    BASES[i % len(BASES)]; the figures per base."""
    phases = [Phase() for _ in bases]
    n = int(rate * seconds)
    urls = [b.rstrip("/") + "/v1/completions" for b in bases]
    rng = np.random.default_rng(seed)  # each request its own prompt, within the engine's vocabulary
    bodies = [json.dumps({"model": model, "prompt": rng.integers(100, VOCAB_SIZE, PROMPT_TOKENS).tolist(),
                          "max_tokens": OUTPUT_TOKENS, "min_tokens": OUTPUT_TOKENS, "ignore_eos": True,
                          "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}).encode()
              for i in range(n)]
    timeout = aiohttp.ClientTimeout(total=300.0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        for base in bases:  # warm the connection pool
            async with session.get(base.rstrip("/") + "/v1/models") as r:
                await r.read()
        tasks = []
        t0 = time.perf_counter() + 0.05
        for phase in phases:
            phase.first_send = t0
        for i, body in enumerate(bodies):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            phase = phases[i % len(bases)]
            tasks.append(asyncio.create_task(_one(session, urls[i % len(bases)], body, phase)))
            phase.num_sent += 1
        await asyncio.gather(*tasks)
    return phases


def _pct_ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else float("nan")


def _model(base: str) -> str:
    async def get() -> str:
        async with aiohttp.ClientSession() as s, s.get(base.rstrip("/") + "/v1/models") as r:
            doc = await r.json()
        return str(doc["data"][0]["id"])

    return asyncio.run(get())


def _table(title: str, phases: dict[str, list[Phase]]) -> dict[str, tuple[float, float]]:
    """Print one comparison's rows; (TTFT p50, p99) in ms per way."""
    print(title)
    print(f"{'way':>7} {'sent':>6} {'ok':>6} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'max ms':>8} {'req/s':>7} "
          f"{'out tok/s':>10}")
    figures = {}
    for mode, ps in phases.items():
        ttft = [t for p in ps for t in p.ttft_s]
        sent, ok = sum(p.num_sent for p in ps), sum(p.num_ok for p in ps)
        wall = sum(p.last_end - p.first_send for p in ps)
        out_tok = sum(p.num_output_tokens for p in ps)
        figures[mode] = (_pct_ms(ttft, 50), _pct_ms(ttft, 99))
        print(f"{mode:>7} {sent:>6} {ok:>6} {figures[mode][0]:>12.2f} {figures[mode][1]:>12.2f} "
              f"{max(ttft) * 1e3 if ttft else float('nan'):>8.1f} {ok / wall:>7.1f} {out_tok / wall:>10.1f}")
    print(f"added by the proxy: TTFT p50 {figures['proxy'][0] - figures['direct'][0]:+.2f} ms, "
          f"p99 {figures['proxy'][1] - figures['direct'][1]:+.2f} ms (target <= {TARGET_ADDED_P99_MS:.0f} ms)")
    if "bare" in figures:
        print(f"added by a bare aiohttp forwarder (no recording: the hop itself): TTFT p50 "
              f"{figures['bare'][0] - figures['direct'][0]:+.2f} ms, "
              f"p99 {figures['bare'][1] - figures['direct'][1]:+.2f} ms")
    return figures


def compare(label: str, upstream: str, seconds: float, rounds: int, tmp: Path) -> None:
    """Direct vs through a capture proxy in front of UPSTREAM: (1) alternating phases, each way at RATE_PER_S;
    (2) interleaved: both ways in the same phases, request by request, RATE_PER_S in total (the same machine
    and upstream state for both, at half the rate each)."""
    out = tmp / f"capture-{label.split()[0]}.jsonl.zst"
    proxy = subprocess.Popen([*KVTRACE, "capture", "--upstream", upstream, "-o", str(out), "--overwrite", "--json"],
                             stdout=subprocess.PIPE, text=True)
    assert proxy.stdout is not None
    proxy_url = proxy.stdout.readline().strip()
    proc = psutil.Process(proxy.pid)
    forwarder = subprocess.Popen([sys.executable, __file__, "--serve-forwarder", upstream], stdout=subprocess.PIPE,
                                 text=True)
    assert forwarder.stdout is not None
    forwarder_url = forwarder.stdout.readline().strip()
    model = _model(upstream)
    alternating: dict[str, list[Phase]] = {"direct": [], "proxy": []}
    interleaved: dict[str, list[Phase]] = {"direct": [], "proxy": [], "bare": []}
    proxy_cpu_s = 0.0
    num_proxied = 0
    seed = 1
    load_before = os.getloadavg()[0]
    try:
        asyncio.run(drive([upstream, proxy_url], model, RATE_PER_S, 1.0, 500))  # warm-up
        for r in range(rounds):
            for mode in (("direct", "proxy") if r % 2 == 0 else ("proxy", "direct")):
                cpu0 = sum(proc.cpu_times()[:2])
                (phase,) = asyncio.run(drive([proxy_url if mode == "proxy" else upstream], model, RATE_PER_S,
                                             seconds, seed))
                if mode == "proxy":
                    proxy_cpu_s += sum(proc.cpu_times()[:2]) - cpu0
                    num_proxied += phase.num_sent
                seed += 1
                alternating[mode].append(phase)
        names = {upstream: "direct", proxy_url: "proxy", forwarder_url: "bare"}
        for r in range(rounds):
            ways = list(names)[r % 3:] + list(names)[:r % 3]
            got = asyncio.run(drive(ways, model, RATE_PER_S, seconds, seed))
            seed += 1
            for way, phase in zip(ways, got, strict=True):
                interleaved[names[way]].append(phase)
    finally:
        proxy.send_signal(signal.SIGTERM)
        summary_text, _ = proxy.communicate(timeout=60)
        forwarder.terminate()
        forwarder.wait()
    summary = json.loads(summary_text)
    load = f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    print(f"\n{label}: {upstream}; {PROMPT_TOKENS}-token prompts, {OUTPUT_TOKENS} output tokens; {load}")
    _table(f"alternating phases, each way at {RATE_PER_S:.0f} requests/s, {rounds} x {seconds:.0f} s per way",
           alternating)
    _table(f"interleaved, request by request, with a bare forwarder as a third way, {RATE_PER_S:.0f} requests/s "
           f"in total, {rounds} x {seconds:.0f} s", interleaved)
    print(f"proxy CPU {proxy_cpu_s * 1e3 / max(num_proxied, 1):.2f} ms per request; recorded "
          f"{summary['num_recorded']} lines (errors {summary['num_errors']}, skipped {summary['num_skipped']})")


def serve_instant() -> None:
    """The instant upstream: /v1/models, and /v1/completions streaming OUTPUT_TOKENS chunks and the usage."""
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "instant", "object": "model"}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(OUTPUT_TOKENS):
            await resp.write(b'data: {"id":"c","choices":[{"index":0,"text":""}]}\n\n')
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": OUTPUT_TOKENS}
        await resp.write(b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", complete)
        await _serve_until_killed(app)

    asyncio.run(run())


async def _serve_until_killed(app: aiohttp.web.Application) -> None:
    """Serve APP on a free loopback port, print its URL as the first line of stdout, and run until killed."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def serve_forwarder(upstream: str) -> None:
    """A bare aiohttp forwarder (no recording, nothing parsed): the floor any proxy hop costs on this machine."""
    from aiohttp import web

    async def run() -> None:
        session = aiohttp.ClientSession(auto_decompress=False)

        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            async with session.request(request.method, upstream + request.raw_path, data=body or None,
                                       headers={"Content-Type": "application/json"}) as up:
                resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers["Content-Type"]})
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        await _serve_until_killed(app)

    asyncio.run(run())


def main() -> None:
    """Parse the options and print both comparisons."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="Length of one phase (default 10 s).")
    ap.add_argument("--rounds", type=int, default=2, help="Direct/proxy phase pairs (default 2).")
    ap.add_argument("--server", help="A running vLLM server instead of starting the CPU engine.")
    ap.add_argument("--skip-engine", action="store_true", help="Only the instant-upstream comparison.")
    ap.add_argument("--serve-instant", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-forwarder", metavar="UPSTREAM", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_instant:
        serve_instant()
        return
    if args.serve_forwarder:
        serve_forwarder(args.serve_forwarder)
        return
    with tempfile.TemporaryDirectory() as tmp:
        instant = subprocess.Popen([sys.executable, __file__, "--serve-instant"], stdout=subprocess.PIPE, text=True)
        try:
            assert instant.stdout is not None
            compare("instant upstream (not vLLM: the proxy's own cost)", instant.stdout.readline().strip(),
                    args.seconds, args.rounds, Path(tmp))
        finally:
            instant.terminate()
            instant.wait()
        if args.skip_engine:
            return
        name = None
        url = args.server
        if url is None:
            name = "bench-capture"
            url = eng.start(num_blocks=2048, block_size=32, max_model_len=2048, name=name).url
        try:
            compare("CPU vLLM engine", url, args.seconds, args.rounds, Path(tmp))
        finally:
            if name is not None:
                eng.stop(name)


if __name__ == "__main__":
    main()

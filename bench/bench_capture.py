"""Capture proxy overhead for the note: TTFT P50/P99 and throughput at 50 requests/s, sent directly and through
`kvtrace capture` (a child process, as users run it), against the real CPU vLLM engine; and, to isolate the
proxy's own cost from the engine's noise, against an instant upstream (NOT vLLM: an aiohttp endpoint in a child
process of this script that streams 4 chunks and the usage at once). Target: the proxy adds <= 2 ms to TTFT
P99 at 50 requests/s.

Open loop: request i is sent at i / rate whatever happened before; short prompts (64 random token ids of the
engine's vocabulary, each request its own, so nothing is cached), 4 output tokens, streamed with usage. Direct
and proxied phases alternate (direct, proxy, proxy, direct, ...) so that both see the same machine; each phase
lasts --seconds. TTFT = the first streamed chunk with a choice - the send time, as replay measures it
(replay/dispatch.py).

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


async def drive(base: str, model: str, rate: float, seconds: float, seed: int) -> Phase:
    """Send rate x seconds streamed completions to BASE at a constant rate (open loop); their figures."""
    phase = Phase()
    n = int(rate * seconds)
    url = base.rstrip("/") + "/v1/completions"
    rng = np.random.default_rng(seed)  # each request its own prompt, within the engine's vocabulary
    bodies = [json.dumps({"model": model, "prompt": rng.integers(100, VOCAB_SIZE, PROMPT_TOKENS).tolist(),
                          "max_tokens": OUTPUT_TOKENS, "min_tokens": OUTPUT_TOKENS, "ignore_eos": True,
                          "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}).encode()
              for i in range(n)]
    timeout = aiohttp.ClientTimeout(total=300.0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        async with session.get(base.rstrip("/") + "/v1/models") as r:  # warm the connection pool
            await r.read()
        tasks = []
        t0 = time.perf_counter() + 0.05
        phase.first_send = t0
        for i, body in enumerate(bodies):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, body, phase)))
            phase.num_sent += 1
        await asyncio.gather(*tasks)
    return phase


def _pct_ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else float("nan")


def _model(base: str) -> str:
    async def get() -> str:
        async with aiohttp.ClientSession() as s, s.get(base.rstrip("/") + "/v1/models") as r:
            doc = await r.json()
        return str(doc["data"][0]["id"])

    return asyncio.run(get())


def compare(label: str, upstream: str, seconds: float, rounds: int, tmp: Path) -> None:
    """Direct vs through a capture proxy in front of UPSTREAM: the table and the added TTFT."""
    out = tmp / f"capture-{label}.jsonl.zst"
    proxy = subprocess.Popen([*KVTRACE, "capture", "--upstream", upstream, "-o", str(out), "--overwrite", "--json"],
                             stdout=subprocess.PIPE, text=True)
    assert proxy.stdout is not None
    proxy_url = proxy.stdout.readline().strip()
    proc = psutil.Process(proxy.pid)
    model = _model(upstream)
    phases: dict[str, list[Phase]] = {"direct": [], "proxy": []}
    proxy_cpu_s = 0.0
    seed = 1
    try:
        asyncio.run(drive(upstream, model, RATE_PER_S, 1.0, 500))  # warm-up: the engine's first requests
        asyncio.run(drive(proxy_url, model, RATE_PER_S, 1.0, 500))
        for r in range(rounds):
            for mode in (("direct", "proxy") if r % 2 == 0 else ("proxy", "direct")):
                cpu0 = sum(proc.cpu_times()[:2])
                phase = asyncio.run(drive(proxy_url if mode == "proxy" else upstream, model, RATE_PER_S, seconds,
                                          seed))
                if mode == "proxy":
                    proxy_cpu_s += sum(proc.cpu_times()[:2]) - cpu0
                seed += 1
                phases[mode].append(phase)
    finally:
        proxy.send_signal(signal.SIGTERM)
        summary_text, _ = proxy.communicate(timeout=60)
    summary = json.loads(summary_text)
    print(f"\n{label}: {upstream}, {RATE_PER_S:.0f} requests/s, {PROMPT_TOKENS}-token prompts, {OUTPUT_TOKENS} output "
          f"tokens, {rounds} x {seconds:.0f} s per way; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")
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
    num_proxied = sum(p.num_sent for p in phases["proxy"])
    print(f"added by the proxy: TTFT p50 {figures['proxy'][0] - figures['direct'][0]:+.2f} ms, "
          f"p99 {figures['proxy'][1] - figures['direct'][1]:+.2f} ms (target <= {TARGET_ADDED_P99_MS:.0f} ms); "
          f"proxy CPU {proxy_cpu_s * 1e3 / max(num_proxied, 1):.2f} ms per request; recorded "
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
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def main() -> None:
    """Parse the options and print both comparisons."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="Length of one phase (default 10 s).")
    ap.add_argument("--rounds", type=int, default=2, help="Direct/proxy phase pairs (default 2).")
    ap.add_argument("--server", help="A running vLLM server instead of starting the CPU engine.")
    ap.add_argument("--skip-engine", action="store_true", help="Only the instant-upstream comparison.")
    ap.add_argument("--serve-instant", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_instant:
        serve_instant()
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

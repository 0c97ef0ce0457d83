"""Capture proxy overhead: TTFT P50/P99 and throughput at 50 requests/s, sent directly and through `kvtrace capture`
(a child process, as users run it), against an instant upstream that isolates the proxy's own cost (NOT vLLM: an
aiohttp endpoint in a child process of this script that streams its chunks and the usage at once) and against the
real CPU vLLM engine. Target: the proxy adds <= 2 ms to TTFT P99 at 50 requests/s.

Ways: `direct` (to the upstream), `proxy` (kvtrace capture of this tree), `bare` (a bare aiohttp forwarder on the
proxy's event loop, uvloop where installed: no recording, nothing parsed; the floor of any Python proxy hop here),
and with --baseline-tree DIR also `base` (the capture proxy of another source tree, e.g. an export of main: before
and after in the same run, so under the same load).

Fair on a shared, loaded 2-core machine: short phases rotate among the ways (a phase sends --phase-s seconds at
the full rate to one way; each round runs every way once, in an order drawn anew each round so that no way always
follows the same one), so every way sees the same machine load and each is driven at the full rate; a way's
figures pool all its phases, after one warm-up phase per way (30 rounds against the instant upstream: 3,000
requests per way, so that a p99 is not the 10th-largest of 1,000); the median over rounds of one round's p99 is
printed too, and the TTFT the capture proxy adds both to `direct` and to `bare` (the same hop without the
recording), pooled and as the median over rounds of the round's difference. Open loop: request i is sent at
i / rate whatever happened before. TTFT = the first streamed chunk with a choice - the send time, as replay
measures it (replay/dispatch.py). The proxies' CPU time per request comes from their processes' own CPU clocks,
the capture's recorder process (a child of the forwarder) included.

Each phase opens with a lead-in (--lead-in-s, 0.5 s at the rate) that is sent but not pooled: between its phases
a way sits idle while the others run (4 s with three ways), and on this machine (a virtual machine) a process
that slept for seconds pays for touching its memory again (reading 20 MB a page at a time takes 4-5 ms after a
4 s sleep, 0.08 ms right after), so the first request through a hop after the idle takes 10-25 ms where a proxy
serving 50 requests/s never idles. With 100 requests a phase, those first requests were exactly the pooled p99.
They are printed apart (`1st`: each phase's first request), not dropped silently.

Requests: against the instant upstream, 64-token prompts and 4 streamed chunks; against the CPU engine, requests
small enough for it to keep up: 48-token prompts whose first 32 tokens (one engine block) are the same in every
request, so the engine caches them, and 1 output token; the engine comparison runs at 50 requests/s and at
--engine-low-rate, and says whether the engine kept up (every request answered at the offered rate, direct TTFT
p99 under KEEPS_UP_P99_MS); where it does not, its queueing swamps the proxy's milliseconds.

Run: .venv/bin/python bench/bench_capture.py [--phase-s 2] [--rounds 30] [--engine-rounds 5] [--server URL]
[--skip-engine] [--baseline-tree DIR]   (--serve-instant / --serve-forwarder: the helpers this script starts)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import psutil
from _common import KVTRACE

from tongyi_trace import engine as eng
from tongyi_trace.engine.model import VOCAB_SIZE

RATE_PER_S = 50.0
TARGET_ADDED_P99_MS = 2.0
LEAD_IN_S = 0.5  # each phase opens with this much at the rate, not pooled: the way was idle (module doc)
KEEPS_UP_P99_MS = 100.0
INSTANT_PROMPT_TOKENS, INSTANT_OUTPUT_TOKENS = 64, 4
ENGINE_PREFIX_TOKENS, ENGINE_PROMPT_TOKENS, ENGINE_OUTPUT_TOKENS = 32, 48, 1


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run CORO on uvloop where installed (as `kvtrace capture` runs), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


@dataclass
class Phase:
    """What one open-loop phase measured: the TTFT of its requests after the lead-in, and of its first request."""

    ttft_s: list[float] = field(default_factory=list)
    first_ttft_s: list[float] = field(default_factory=list)  # the first request, after the way sat idle
    num_sent: int = 0
    num_ok: int = 0
    num_output_tokens: int = 0
    first_send: float = 0.0
    last_end: float = 0.0


@dataclass
class Way:
    """One way of sending the requests: its URL, the process whose CPU time is counted (proxies), its phases."""

    name: str
    url: str
    proc: psutil.Process | None = None
    phases: list[Phase] = field(default_factory=list)
    cpu_s: float = 0.0  # the proxy's processes: the forwarder and its children (the capture's recorder)
    own_cpu_s: float = 0.0  # the forwarder's alone


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, phase: Phase, kind: str) -> None:
    """Send BODY to URL; its TTFT goes to PHASE's figures if KIND is "counted", to its first request's if
    "first" (a lead-in request is sent, and counted as sent and answered, but its TTFT is not pooled)."""
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
        if kind == "counted":
            phase.ttft_s.append(ttft)
        elif kind == "first":
            phase.first_ttft_s.append(ttft)


async def drive(session: aiohttp.ClientSession, url: str, bodies: list[bytes], rate: float,
                num_lead_in: int = 0) -> Phase:
    """Send BODIES to URL at RATE per second (open loop); what the phase measured, its first NUM_LEAD_IN requests
    sent but not pooled (the first one's TTFT kept apart)."""
    phase = Phase()
    tasks = []
    t0 = phase.first_send = time.perf_counter() + 0.01
    for i, body in enumerate(bodies):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        kind = "counted" if i >= num_lead_in else "first" if i == 0 else "lead-in"
        tasks.append(asyncio.create_task(_one(session, url, body, phase, kind)))
        phase.num_sent += 1
    await asyncio.gather(*tasks)
    return phase


def request_bodies(model: str, num: int, seed: int, prompt_tokens: int, output_tokens: int,
                   prefix: list[int]) -> list[bytes]:
    """NUM streamed completions with usage: PREFIX then random token ids of the engine's vocabulary (each request
    its own) up to PROMPT_TOKENS, OUTPUT_TOKENS generated."""
    rng = np.random.default_rng(seed)
    return [json.dumps({"model": model, "prompt": prefix + rng.integers(100, VOCAB_SIZE, prompt_tokens - len(prefix))
                        .tolist(), "max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True,
                        "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}).encode()
            for _ in range(num)]


def _cpu_s(proc: psutil.Process | None) -> tuple[float, float]:
    """(the CPU time of PROC and its children, of PROC alone), in s; the capture's recorder is its child."""
    if proc is None:
        return 0.0, 0.0
    own = sum(proc.cpu_times()[:2])
    return own + sum(sum(c.cpu_times()[:2]) for c in proc.children(recursive=True)), own


def rotate_phases(ways: list[Way], make_bodies: Callable[[int, int], list[bytes]], rate: float, phase_s: float,
                  rounds: int, lead_in_s: float) -> None:
    """One warm-up phase per way, then ROUNDS rounds of one phase per way at RATE (in an order drawn anew each
    round, so that no way always follows the same one): LEAD_IN_S s of requests not pooled, then PHASE_S s pooled;
    every measured phase is appended to its way, its proxy's CPU time added."""
    num_lead_in = int(rate * lead_in_s)
    num = num_lead_in + int(rate * phase_s)

    async def run() -> None:
        timeout = aiohttp.ClientTimeout(total=300.0)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            seed = 1000
            for way in ways:  # warm-up: connections, the proxies' first-request imports
                await drive(session, way.url + "/v1/completions", make_bodies(int(rate), seed), rate)
                seed += 1
            rng = random.Random(0)
            for _ in range(rounds):
                for way in rng.sample(ways, len(ways)):
                    bodies = make_bodies(num, seed)
                    seed += 1
                    cpu0 = _cpu_s(way.proc)
                    way.phases.append(await drive(session, way.url + "/v1/completions", bodies, rate, num_lead_in))
                    cpu1 = _cpu_s(way.proc)
                    way.cpu_s += cpu1[0] - cpu0[0]
                    way.own_cpu_s += cpu1[1] - cpu0[1]

    _run(run())


def _pct_ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else float("nan")


def _round_p99_ms(phase: Phase) -> float:
    return _pct_ms(phase.ttft_s, 99)


def report(title: str, ways: list[Way], rate: float, engine: bool) -> dict[str, Any]:
    """Print one comparison's table, whether the ENGINE kept up, and the TTFT each way adds to direct's and the
    capture proxy adds to the bare forwarder's: pooled over all rounds (judged against the target at RATE_PER_S,
    unless the engine did not keep up: then its queueing is what differs), and the median over rounds of one
    round's difference (each round's phases ran under the same load); the figures."""
    print(title)
    print(f"{'way':>7} {'sent':>6} {'ok':>6} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'rounds p99':>11} {'max ms':>8} "
          f"{'1st p50':>8} {'1st max':>8} {'req/s':>7} {'out tok/s':>10} {'CPU ms/req':>11} {'fwd CPU':>8}")
    figures: dict[str, Any] = {}
    for way in ways:
        ttft = [t for p in way.phases for t in p.ttft_s]
        first = [t for p in way.phases for t in p.first_ttft_s]
        sent, ok = sum(p.num_sent for p in way.phases), sum(p.num_ok for p in way.phases)
        wall = sum(p.last_end - p.first_send for p in way.phases)
        out_tok = sum(p.num_output_tokens for p in way.phases)
        cpu = f"{way.cpu_s * 1e3 / max(sent, 1):.2f}" if way.proc is not None else ""
        own = f"{way.own_cpu_s * 1e3 / max(sent, 1):.2f}" if way.proc is not None else ""
        p50, p99 = _pct_ms(ttft, 50), _pct_ms(ttft, 99)
        rounds_p99 = float(np.median([_round_p99_ms(p) for p in way.phases]))
        figures[way.name] = {"p50_ms": p50, "p99_ms": p99, "num_sent": sent, "num_ok": ok, "req_per_s": ok / wall,
                             "rounds_p99_ms": rounds_p99, "first_p50_ms": _pct_ms(first, 50),
                             "first_max_ms": _pct_ms(first, 100)}
        print(f"{way.name:>7} {sent:>6} {ok:>6} {p50:>12.2f} {p99:>12.2f} {rounds_p99:>11.2f} "
              f"{max(ttft) * 1e3 if ttft else float('nan'):>8.1f} {figures[way.name]['first_p50_ms']:>8.1f} "
              f"{figures[way.name]['first_max_ms']:>8.1f} {ok / wall:>7.1f} {out_tok / wall:>10.1f} {cpu:>11} {own:>8}")
    print("(p50, p99: over every request of a way after its phases' lead-ins; rounds p99: the median over rounds of "
          "one round's p99; 1st: each phase's first request, sent after the way sat idle while the others ran, "
          "not pooled; CPU: the proxy's processes, the capture's recorder included; fwd CPU: its forwarding "
          "process alone)")
    d = figures["direct"]
    kept = d["num_ok"] == d["num_sent"] and d["req_per_s"] >= 0.97 * rate and d["p99_ms"] <= KEEPS_UP_P99_MS
    if engine:
        print(f"the engine {'keeps up' if kept else 'does NOT keep up'} at {rate:.0f} requests/s (direct: "
              f"{d['num_ok']}/{d['num_sent']} answered, {d['req_per_s']:.1f} req/s, TTFT p99 {d['p99_ms']:.0f} ms; "
              f"keeping up: all answered at the rate, p99 <= {KEEPS_UP_P99_MS:.0f} ms)")
    by_name = {way.name: way for way in ways}
    pairs = [(way.name, "direct") for way in ways[1:]]
    pairs += [(name, "bare") for name in ("proxy", "base") if name in by_name and "bare" in by_name]
    for name, ref in pairs:
        f, r = figures[name], figures[ref]
        added_p50, added_p99 = f["p50_ms"] - r["p50_ms"], f["p99_ms"] - r["p99_ms"]
        rounds = float(np.median([_round_p99_ms(a) - _round_p99_ms(b)
                                  for a, b in zip(by_name[name].phases, by_name[ref].phases, strict=True)]))
        judged = name == "proxy" and ref == "direct" and rate == RATE_PER_S
        verdict = ("PASS" if added_p99 <= TARGET_ADDED_P99_MS else "FAIL") if kept or not engine else \
            "not measurable: the engine's queueing, not the proxy, sets these figures"
        figures[name][f"added_to_{ref}"] = {"p50_ms": added_p50, "p99_ms": added_p99, "rounds_p99_ms": rounds}
        print(f"{name:>5} adds to {ref:>6}: TTFT p50 {added_p50:+.2f} ms, p99 {added_p99:+.2f} ms (median over "
              f"rounds {rounds:+.2f} ms)"
              + (f"  (target <= {TARGET_ADDED_P99_MS:.0f} ms at {RATE_PER_S:.0f} requests/s: {verdict})" if judged
                 else ""))
    return figures


def _start_child(args: list[str], env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start ARGS (in CWD); (the process, the URL it prints as its first line)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _model(base: str) -> str:
    async def get() -> str:
        async with aiohttp.ClientSession() as s, s.get(base + "/v1/models") as r:
            doc = await r.json()
        return str(doc["data"][0]["id"])

    return str(_run(get()))


def compare(label: str, upstream: str, runs: list[tuple[float, int]], phase_s: float, lead_in_s: float, tmp: Path,
            baseline_tree: Path | None, engine: bool) -> None:
    """Direct, through a capture proxy and through a bare forwarder in front of UPSTREAM (and the capture proxy
    of BASELINE_TREE): for each (rate, rounds) of RUNS, rotating phases (LEAD_IN_S s not pooled, then PHASE_S s)
    at that rate, then a table."""
    model = _model(upstream)
    if engine:
        prefix = np.random.default_rng(7).integers(100, VOCAB_SIZE, ENGINE_PREFIX_TOKENS).tolist()
        shape = f"{ENGINE_PROMPT_TOKENS}-token prompts ({ENGINE_PREFIX_TOKENS} shared), {ENGINE_OUTPUT_TOKENS} output"

        def make_bodies(num: int, seed: int) -> list[bytes]:
            return request_bodies(model, num, seed, ENGINE_PROMPT_TOKENS, ENGINE_OUTPUT_TOKENS, prefix)
    else:
        shape = f"{INSTANT_PROMPT_TOKENS}-token prompts, {INSTANT_OUTPUT_TOKENS} output"

        def make_bodies(num: int, seed: int) -> list[bytes]:
            return request_bodies(model, num, seed, INSTANT_PROMPT_TOKENS, INSTANT_OUTPUT_TOKENS, [])

    children: list[tuple[str, subprocess.Popen[str]]] = []
    ways = [Way("direct", upstream)]
    try:
        def capture_child(name: str, tree: Path | None) -> None:
            # `python -m` puts the working folder first on the path, before PYTHONPATH: the baseline runs in its
            # tree (run from this one, it was this tree's proxy)
            out = tmp / f"capture-{name}-{'engine' if engine else 'instant'}.jsonl.zst"
            env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
            proc, url = _start_child([*KVTRACE, "capture", "--upstream", upstream, "-o", str(out), "--overwrite",
                                      "--json"], env, tree)
            children.append((name, proc))
            ways.append(Way(name, url, psutil.Process(proc.pid)))

        capture_child("proxy", None)
        proc, url = _start_child([sys.executable, __file__, "--serve-forwarder", upstream])
        children.append(("bare", proc))
        ways.append(Way("bare", url, psutil.Process(proc.pid)))
        if baseline_tree is not None:
            capture_child("base", baseline_tree)
        for rate, rounds in runs:
            for way in ways:
                way.phases, way.cpu_s, way.own_cpu_s = [], 0.0, 0.0
            load_before = os.getloadavg()[0]
            rotate_phases(ways, make_bodies, rate, phase_s, rounds, lead_in_s)
            print(f"\n{label}: {upstream}; {shape} tokens; {rate:.0f} requests/s to each way in turn, {rounds} "
                  f"rounds of {lead_in_s:g} + {phase_s:g} s phases per way; load average {load_before:.1f} -> "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            report(f"{'-' * 7} {len(ways)} ways, phases in a random order each round", ways, rate, engine)
    finally:
        for name, proc in children:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            if name != "bare":
                s = json.loads(out)
                print(f"{name}: recorded {s['num_recorded']} lines (errors {s['num_errors']}, skipped "
                      f"{s['num_skipped']})")


def serve_instant() -> None:
    """The instant upstream: /v1/models, and /v1/completions streaming max_tokens chunks, then the usage."""
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "instant", "object": "model"}]})

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await resp.write(b'data: {"id":"c","choices":[{"index":0,"text":""}]}\n\n')
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
        await resp.write(b"data: " + json.dumps({"id": "c", "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    _run(_serve_until_killed(app))


async def _serve_until_killed(app: aiohttp.web.Application) -> None:
    """Serve APP on a free loopback port, print its URL as the first line of stdout, and run until killed."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def serve_forwarder(upstream: str) -> None:
    """A bare aiohttp forwarder (no recording, nothing parsed; the proxy's event loop and pooled session): the floor
    any Python proxy hop costs on this machine."""
    from aiohttp import web

    async def run() -> None:
        session = aiohttp.ClientSession(auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())

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

    _run(run())


def main() -> None:
    """Parse the options and print both comparisons."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase-s", type=float, default=2.0, help="Length of one phase's pooled part (default 2 s).")
    ap.add_argument("--lead-in-s", type=float, default=LEAD_IN_S,
                    help=f"Length of one phase's lead-in, sent but not pooled (default {LEAD_IN_S:g} s; 0: none).")
    ap.add_argument("--rounds", type=int, default=30, help="Rounds against the instant upstream (default 30: 3,000 "
                    "requests per way, so that its p99 is the 30th-largest, not the 10th of 1,000).")
    ap.add_argument("--engine-rounds", type=int, default=5, help="Rounds per rate against the engine (default 5).")
    ap.add_argument("--engine-low-rate", type=float, default=20.0,
                    help="The engine's second rate, requests/s (default 20; 0: 50 requests/s only).")
    ap.add_argument("--server", help="A running vLLM server instead of starting the CPU engine.")
    ap.add_argument("--skip-engine", action="store_true", help="Only the instant-upstream comparison.")
    ap.add_argument("--baseline-tree", type=Path,
                    help="Also run the capture proxy of this source tree (e.g. `git archive main` unpacked).")
    ap.add_argument("--serve-instant", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-forwarder", metavar="UPSTREAM", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_instant:
        serve_instant()
        return
    if args.serve_forwarder:
        serve_forwarder(args.serve_forwarder)
        return
    tree = args.baseline_tree.resolve() if args.baseline_tree else None
    with tempfile.TemporaryDirectory() as tmp:
        instant, url = _start_child([sys.executable, __file__, "--serve-instant"])
        try:
            compare("instant upstream (not vLLM: the proxy's own cost)", url, [(RATE_PER_S, args.rounds)],
                    args.phase_s, args.lead_in_s, Path(tmp), tree, engine=False)
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
        rates = [(RATE_PER_S, args.engine_rounds)] + ([(args.engine_low_rate, args.engine_rounds)]
                                                      if args.engine_low_rate > 0 else [])
        try:
            compare("CPU vLLM engine", url.rstrip("/"), rates, args.phase_s, args.lead_in_s, Path(tmp), tree,
                    engine=True)
        finally:
            if name is not None:
                eng.stop(name)


if __name__ == "__main__":
    main()

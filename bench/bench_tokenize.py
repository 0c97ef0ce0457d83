"""What a capture's token ids cost (`make bench`): the upstream's POST /tokenize against a local tokenizer.json.

Starts the CPU engine with its local tokenizer (`kvtrace engine start --tokenizer`, stopped at the end) and
asks capture/tokenize.py's two token sources for the ids of chat requests of about 500, 2,000 and 8,000
tokens (a system prompt and a user turn of generated text), one request at a time, 40 times each.
Printed per size: the tokens, and the P50/P99 milliseconds of the upstream source (an HTTP round trip to
vLLM's API server, which renders the chat template and tokenizes) and of the local source (jinja2 render +
`tokenizers`; a text over 4,096 characters is encoded in a worker thread), and the P99 and largest lag of
the event loop while the local source ran (how late a 1 ms timer woke: what the proxy's other streams
would wait), beside the loop's lag with nothing to do (the first row, "idle": the machine's own noise).
No target: the figures say which source to use in front of a loaded server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from _common import KVTRACE

from tongyi_trace.capture.tokenize import CHAT_PATH, make_token_source
from tongyi_trace.engine.tokenizer import corpus_text

SIZES_CHARS = (2_500, 10_000, 40_000)  # the generated text runs about 5 characters a token
REPEATS = 40


def chat_body(model: str, num_chars: int, salt: int) -> dict[str, Any]:
    text = corpus_text()[salt * 97: salt * 97 + num_chars]
    half = len(text) // 2
    return {"model": model, "messages": [{"role": "system", "content": text[:half]},
                                         {"role": "user", "content": text[half:]}]}


async def lag_samples_ms(stop: asyncio.Event) -> list[float]:
    """How late each 1 ms sleep on this loop woke, until STOP is set."""
    out = []
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        out.append((time.perf_counter() - t0 - 0.001) * 1e3)
    return out


async def local_run(local: Any, bodies: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """The local source's latencies over BODIES, and the loop's lag samples meanwhile (each call a task of
    its own, as the proxy makes them, with the loop free between calls)."""
    stop = asyncio.Event()
    monitor = asyncio.create_task(lag_samples_ms(stop))
    await asyncio.sleep(0.01)
    times_ms = []
    for body in bodies:
        t0 = time.perf_counter()
        await asyncio.create_task(local.prompt_token_ids(CHAT_PATH, body))
        times_ms.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(0.002)
    stop.set()
    return times_ms, await monitor


async def idle_lag_ms(seconds: float) -> list[float]:
    """The loop's lag samples over SECONDS with nothing else to do (the machine's own noise)."""
    stop = asyncio.Event()
    monitor = asyncio.create_task(lag_samples_ms(stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await monitor


async def measure(url: str, model: str, tokenizer_file: Path) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [("idle", np.nan, np.nan, np.nan, np.nan, *np.percentile(await idle_lag_ms(2.0),
                                                                                         [99, 100]))]
    async with aiohttp.ClientSession() as session:
        upstream = make_token_source(url, session)
        local = make_token_source(url, session, tokenizer_file)
        for num_chars in SIZES_CHARS:
            bodies = [chat_body(model, num_chars, i) for i in range(REPEATS)]
            up_ms = []
            num_tokens = 0
            for body in bodies:
                t0 = time.perf_counter()
                num_tokens = len(await upstream.prompt_token_ids(CHAT_PATH, body))
                up_ms.append((time.perf_counter() - t0) * 1e3)
            local_ms, lag_ms = await local_run(local, bodies)
            rows.append((num_tokens, *np.percentile(up_ms, [50, 99]), *np.percentile(local_ms, [50, 99]),
                         *np.percentile(lag_ms, [99, 100])))
    return rows


def main() -> None:
    name = f"bench-tok-{os.getpid()}"
    proc = subprocess.run([*KVTRACE, "engine", "start", "--tokenizer", "--name", name, "--json", "--num-blocks",
                           "640", "--max-model-len", "16384"], capture_output=True, text=True, check=True)
    try:
        st = json.loads(proc.stdout)
        rows = asyncio.run(measure(st["url"], st["served_model_name"], Path(st["tokenizer_file"])))
    finally:
        subprocess.run([*KVTRACE, "engine", "stop", "--name", name, "--quiet"], check=False)
    print(f"chat token ids, {REPEATS} requests a size, one at a time (ms)")
    print(f"{'tokens':>7} {'upstream P50':>13} {'P99':>7} {'local P50':>10} {'P99':>7} {'loop lag P99':>13} "
          f"{'max':>7}")
    for num_tokens, up50, up99, lo50, lo99, lag99, lag_max in rows:
        if num_tokens == "idle":
            print(f"{'idle':>7} {'-':>13} {'-':>7} {'-':>10} {'-':>7} {lag99:>13.2f} {lag_max:>7.2f}")
            continue
        print(f"{num_tokens:>7} {up50:>13.2f} {up99:>7.2f} {lo50:>10.2f} {lo99:>7.2f} {lag99:>13.2f} {lag_max:>7.2f}")


if __name__ == "__main__":
    main()

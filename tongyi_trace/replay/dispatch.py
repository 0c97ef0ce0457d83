"""Open-loop dispatch of the schedule to an OpenAI-compatible vLLM server (aiohttp, streaming).

Each request is sent at its scheduled time as
POST /v1/completions with the token-id prompt, max_tokens = min_tokens = the trace's output length,
ignore_eos, stream with stream_options.include_usage (the final usage chunk carries
prompt_tokens_details.cached_tokens), and `"vllm_xargs": {"kv_category": category, "kv_time_s": trace time,
"kv_block_keys": the simulator's ids of the request's engine blocks}` (arrives in the engine as
SamplingParams.extra_args: the WA plugin ages blocks on the trace's clock, as the simulator does, and its
guard samples the blocks the simulator samples). TTFT = first chunk with a choice - send time.
With several servers (a fleet replay), each request goes to the server of its instance (replay/fleet.py
routes them) and its record says which.
Drift is the client's own lateness: send time - the time the request was free to go, its scheduled time or,
when --max-in-flight (a full semaphore) or --closed-sessions (a parent still running) held it back, the moment
it was released; that hold is recorded apart (held_ms): counted as drift, it made a one-at-a-time replay of a
bursty trace look seconds late when the client was on time. A request body is built before its send time,
never on the critical path, and, when the next request is not due yet, after the request before it has
started (a body of a long prompt takes up to ~20 ms to build); behind schedule, the loop sends without
yielding until it has caught up. Optional bounds: max_in_flight (a global concurrency cap, FIFO) and closed
sessions (a child waits for its parent to finish).
HTTP 429 (too many requests) and 503 (unavailable) are retried, at most max_retries times, after the delay
the server's Retry-After asks for (delay-seconds or an HTTP date; without one: 1 s, doubling), unless it asks
for more than max_retry_wait_s; the record counts the retries and the time waited (TTFT and end-to-end are
the last attempt's), and a request still refused is an error record ("... (after 3 retries)").
A stop (Ctrl-C, SIGTERM, SIGHUP) cancels the dispatch from the event loop, never in the middle of a
request's bookkeeping: nothing more is sent, the requests in flight get stop_grace_s to finish, and each one
still running then is cancelled and recorded (status "cancelled", with what was known: HTTP status, TTFT),
so records.jsonl holds every request sent; a second stop cancels them at once. It ends in KeyboardInterrupt.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import aiohttp
import numpy as np

from tongyi_trace.replay.records import RecordWriter, RequestRecord
from tongyi_trace.replay.schedule import ScheduledRequest
from tongyi_trace.stops import STOP_SIGNALS, stop_interrupt

PromptFn = Callable[[ScheduledRequest], tuple[np.ndarray, np.ndarray | None]]  # token ids, block keys
COMPLETIONS_PATH = "/v1/completions"
RETRY_STATUSES = frozenset({429, 503})  # the server asks the client to come back later (Retry-After)
DEFAULT_RETRY_WAIT_S = 1.0  # the first retry's delay when the server names none (doubling after)


@dataclass
class DispatchState:
    """Live counters (read by the progress callback)."""

    num_scheduled: int
    num_sent: int = 0
    num_done: int = 0
    num_errors: int = 0
    num_retries: int = 0  # re-sends after HTTP 429/503
    num_cancelled: int = 0  # in flight at a stop, cancelled after the grace
    prompt_tokens_ok: int = 0
    cached_tokens_ok: int = 0

    @property
    def hit_ratio(self) -> float | None:
        """Cached / prompt tokens over the requests finished so far (engine's own per-request counts)."""
        return self.cached_tokens_ok / self.prompt_tokens_ok if self.prompt_tokens_ok else None


@dataclass(frozen=True)
class DispatchOptions:
    """How requests are sent."""

    model: str
    api_key: str | None = None
    max_in_flight: int | None = None
    closed_sessions: bool = False
    request_timeout_s: float = 600.0
    start_delay_s: float = 0.05
    max_retries: int = 3  # re-sends of a request answered HTTP 429/503
    max_retry_wait_s: float = 60.0  # a Retry-After asking for longer is not waited for: the request fails
    stop_grace_s: float = 2.0  # at a stop, the requests in flight get this long to finish


def request_body(model: str, prompt: np.ndarray, sr: ScheduledRequest,
                 block_keys: np.ndarray | None = None) -> bytes:
    """The JSON body of one completion request (BLOCK_KEYS: its engine blocks' ids, sent when given)."""
    xargs: dict[str, object] = {"kv_category": sr.category, "kv_time_s": sr.arrival_s}
    if block_keys is not None:
        xargs["kv_block_keys"] = block_keys.tolist()
    return json.dumps({
        "model": model,
        "prompt": prompt.tolist(),
        "max_tokens": sr.max_tokens,
        "min_tokens": sr.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "vllm_xargs": xargs,
    }, separators=(",", ":")).encode()


def _error_text(raw: str) -> str:
    try:
        obj = json.loads(raw)
        err = obj.get("error", obj)
        msg = err.get("message", raw) if isinstance(err, dict) else str(err)
    except (json.JSONDecodeError, AttributeError):
        msg = raw
    return " ".join(str(msg).split())[:300]


def _parse_chunk(data: bytes) -> dict[str, object]:
    """One streamed `data:` payload as a JSON object; ValueError for anything else. Bytes that are not UTF-8
    (a token cut inside a character) are replaced: the reply's figures do not depend on its text."""
    obj = json.loads(data.decode("utf-8", errors="replace"))
    if not isinstance(obj, dict):
        raise ValueError(f"stream chunk is not a JSON object: {data[:80]!r}")
    if obj.get("usage") is not None and not isinstance(obj["usage"], dict):
        raise ValueError(f"stream chunk's 'usage' is not an object: {str(obj['usage'])[:80]!r}")
    return obj


def retry_after_s(value: str | None, now_s: float | None = None) -> float | None:
    """The seconds a Retry-After header VALUE asks to wait (RFC 9110: delay-seconds or an HTTP date, a date
    in the past is 0; a fractional number is taken too); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        wait = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        wait = when.timestamp() - (time.time() if now_s is None else now_s)
        return max(0.0, wait)
    return wait if math.isfinite(wait) and wait >= 0 else None


@dataclass
class _Attempt:
    """What one POST of a request got, filled in as it arrives (a cancelled request keeps what was known)."""

    sent: float
    ttft: float | None = None
    token_times: list[float] = field(default_factory=list)  # arrival of every chunk carrying choices (tokens)
    usage: dict[str, object] | None = None
    status: str = "ok"
    http_status: int | None = None
    error: str | None = None
    retry_after: str | None = None


async def _attempt(session: aiohttp.ClientSession, url: str, body: bytes, sr: ScheduledRequest,
                   headers: dict[str, str], att: _Attempt) -> None:
    """POST the request once, filling ATT; every failure (including a reply the client cannot understand)
    is ATT's error."""
    try:
        async with session.post(url, data=body,
                                headers={**headers, "X-Request-Id": f"kvtrace-{sr.req_idx}"}) as resp:
            att.http_status = resp.status
            if resp.status != 200:
                att.retry_after = resp.headers.get("Retry-After")
                raw_err = (await resp.content.read(64 * 1024)).decode(errors="replace")
                att.status, att.error = "error", f"HTTP {resp.status}: {_error_text(raw_err)}"
                return
            async for raw in resp.content:
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    break
                obj = _parse_chunk(data)
                if "error" in obj:
                    att.status, att.error = "error", f"stream error: {_error_text(data.decode(errors='replace'))}"
                    break
                if obj.get("choices"):
                    att.token_times.append(time.perf_counter())
                    if att.ttft is None:
                        att.ttft = att.token_times[0] - att.sent
                if obj.get("usage"):
                    att.usage = obj["usage"]  # type: ignore[assignment]
            if att.status == "ok" and att.usage is None:
                att.status, att.error = "error", "stream ended without a usage chunk"
    except Exception as e:  # any failure of one request is that request's error record
        text = " ".join(str(e).split())[:300]
        if not text and isinstance(e, asyncio.TimeoutError):  # aiohttp's timeout says nothing of itself
            total = session.timeout.total
            text = f"no complete reply within {total:g} s (--request-timeout-s)" if total else "timed out"
        att.status, att.error = "error", f"{type(e).__name__}: {text}" if text else type(e).__name__
        att.usage = None


async def _send(session: aiohttp.ClientSession, url: str, body: bytes, sr: ScheduledRequest,
                num_prompt: int, t0: float, headers: dict[str, str], instance: int = 0,
                ready_s: float | None = None, opts: DispatchOptions | None = None,
                state: DispatchState | None = None) -> RequestRecord:
    """Send one request (retried after HTTP 429/503 as OPTS say, counted in STATE); every outcome is a record,
    also a cancellation (the replay's stop): status "cancelled" with what was known. READY_S: when it was free
    to go, seconds from T0 (later than its scheduled time when it was held back)."""
    max_retries = opts.max_retries if opts is not None else 0
    max_wait_s = opts.max_retry_wait_s if opts is not None else 0.0
    first_sent = time.perf_counter()
    att = _Attempt(sent=first_sent)
    retries, waited_s = 0, 0.0
    try:
        while True:
            await _attempt(session, url, body, sr, headers, att)
            if att.http_status not in RETRY_STATUSES or retries >= max_retries:
                break
            asked = retry_after_s(att.retry_after)
            wait_s = asked if asked is not None else DEFAULT_RETRY_WAIT_S * 2 ** retries
            if wait_s > max_wait_s:
                att.error = f"{att.error} (Retry-After {wait_s:g} s is over the {max_wait_s:g} s limit: not retried)"
                break
            status_before = att.http_status
            att = _Attempt(sent=first_sent, http_status=status_before, status="error", error=att.error)
            await asyncio.sleep(wait_s)  # (a stop cancels the wait: the record says the last refusal)
            retries += 1
            waited_s += wait_s
            if state is not None:
                state.num_retries += 1
            att = _Attempt(sent=time.perf_counter())
        if retries and att.status != "ok":
            att.error = f"{att.error} (after {retries} {'retry' if retries == 1 else 'retries'})"
    except asyncio.CancelledError:  # the replay's stop, after its grace: recorded with what was known
        cut_ms = (time.perf_counter() - att.sent) * 1e3
        known = f"HTTP {att.http_status}, " if att.http_status is not None else "no reply yet, "
        if att.ttft is not None:
            known += f"first token after {att.ttft * 1e3:.0f} ms, "
        att.status, att.usage = "cancelled", None
        att.error = f"cancelled by the replay's stop {cut_ms:.0f} ms after it was sent ({known.rstrip(', ')})"
    end = time.perf_counter()
    ready = sr.scheduled_s if ready_s is None else ready_s
    usage = att.usage
    ok = att.status == "ok"
    details = usage.get("prompt_tokens_details") if usage else None
    tpot, itl = _decode_times(att.token_times, _int(usage.get("completion_tokens")) if usage else None, ok)
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return RequestRecord(
        req_idx=sr.req_idx, session_id=sr.session_id, category=sr.category, scheduled_s=sr.scheduled_s,
        sent_s=first_sent - t0, drift_ms=(first_sent - t0 - max(sr.scheduled_s, ready)) * 1e3,
        held_ms=max(0.0, ready - sr.scheduled_s) * 1e3,
        ttft_ms=att.ttft * 1e3 if att.ttft is not None else None,
        e2e_ms=(end - att.sent) * 1e3 if ok else None, prompt_tokens=num_prompt,
        engine_prompt_tokens=_int(usage.get("prompt_tokens")) if usage else None,
        cached_tokens=_int(cached), output_tokens=_int(usage.get("completion_tokens")) if usage else None,
        max_tokens=sr.max_tokens, status=att.status, http_status=att.http_status, error=att.error,
        tpot_ms=tpot, itl_ms=itl, instance=instance, retries=retries, retry_wait_ms=waited_s * 1e3)


def _decode_times(token_times: list[float], output_tokens: int | None, ok: bool) -> tuple[float | None,
                                                                                          list[float] | None]:
    """TPOT (ms per output token after the first) and the inter-chunk latencies (ms) of one request."""
    if not ok or len(token_times) < 2:
        return None, [] if ok else None
    n = output_tokens if output_tokens and output_tokens > 1 else len(token_times)
    itl = [round((b - a) * 1e3, 3) for a, b in pairwise(token_times)]
    return (token_times[-1] - token_times[0]) * 1e3 / (n - 1), itl


def _int(v: object) -> int | None:
    """A finite non-negative count from the server, else None (booleans, NaN, strings are not counts)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 or v >= 2**62:
        return None
    return int(v)


@contextlib.contextmanager
def _stop_signals_cancel(task: asyncio.Task[None] | None, received: list[signal.Signals]) -> Iterator[None]:
    """Within the block, stops.STOP_SIGNALS cancel TASK from the running loop (appended to RECEIVED), instead
    of a handler raising wherever the process happens to be (inside a request's task, which then dies
    unretrieved, or between sending and recording); outside the main thread, nothing changes. (Ctrl-C:
    asyncio.run cancels the main task itself.)"""
    if task is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def stop(sig: signal.Signals) -> None:
        received.append(sig)
        task.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


async def dispatch(url: str | Sequence[str], requests: list[ScheduledRequest], prompt_fn: PromptFn,
                   opts: DispatchOptions, writer: RecordWriter, state: DispatchState,
                   on_update: Callable[[DispatchState], None] | None = None,
                   instance_of: Mapping[int, int] | None = None) -> None:
    """Send REQUESTS at their scheduled times; write each finished request's record as it completes. URL:
    one server, or several with INSTANCE_OF (req_idx -> index in URL) saying where each request goes.
    A stop signal ends it with KeyboardInterrupt('stopped by SIGTERM') (module doc)."""
    received: list[signal.Signals] = []
    with _stop_signals_cancel(asyncio.current_task(), received):
        try:
            await _dispatch(url, requests, prompt_fn, opts, writer, state, on_update, instance_of)
        except asyncio.CancelledError:
            if received:
                raise stop_interrupt(received[0]) from None
            raise


async def _dispatch(url: str | Sequence[str], requests: list[ScheduledRequest], prompt_fn: PromptFn,
                    opts: DispatchOptions, writer: RecordWriter, state: DispatchState,
                    on_update: Callable[[DispatchState], None] | None,
                    instance_of: Mapping[int, int] | None) -> None:
    headers = {"Content-Type": "application/json"}
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s, sock_connect=30.0)
    urls = [url] if isinstance(url, str) else list(url)
    completions_urls = [u.rstrip("/") + COMPLETIONS_PATH for u in urls]
    sem = asyncio.Semaphore(opts.max_in_flight) if opts.max_in_flight else None
    finished: dict[int, asyncio.Event] = {}
    tasks: set[asyncio.Task[None]] = set()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
    stopping = asyncio.Event()  # set at a stop: nothing more is sent
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm up the client (lazy imports, first connection) so that it does not delay the first sends.
        for u in urls:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(u.rstrip("/") + "/v1/models", headers=headers) as r:
                    await r.read()
        t0 = time.perf_counter() + opts.start_delay_s

        async def one(sr: ScheduledRequest, body: bytes, num_prompt: int, parent: asyncio.Event | None,
                      instance: int, ready_s: float) -> None:
            try:
                if parent is not None and not parent.is_set():
                    await parent.wait()
                    ready_s = max(ready_s, time.perf_counter() - t0)  # held back by its parent
                if stopping.is_set():  # its parent finished during a stop's grace: not sent
                    return
                state.num_sent += 1
                rec = await _send(session, completions_urls[instance], body, sr, num_prompt, t0, headers,
                                  instance, ready_s, opts, state)
                writer.write(rec)
                state.num_done += 1
                if rec.ok:
                    state.prompt_tokens_ok += rec.prompt_tokens
                    state.cached_tokens_ok += rec.cached_tokens or 0
                elif rec.status == "cancelled":
                    state.num_cancelled += 1
                else:
                    state.num_errors += 1
                if on_update is not None:
                    on_update(state)
            finally:
                if sr.req_idx in finished:
                    finished[sr.req_idx].set()
                if sem is not None:
                    sem.release()

        try:
            for k, sr in enumerate(requests):
                prompt, keys = prompt_fn(sr)
                body = request_body(opts.model, prompt, sr, keys)
                if opts.closed_sessions:
                    finished[sr.req_idx] = asyncio.Event()
                parent = finished.get(sr.parent_req_idx) if (
                    opts.closed_sessions and sr.parent_req_idx is not None and sr.parent_req_idx < sr.req_idx
                ) else None
                delay = t0 + sr.scheduled_s - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                ready_s = sr.scheduled_s
                if sem is not None:
                    held = sem.locked()
                    await sem.acquire()
                    if held:  # held back by --max-in-flight: free to go from now on
                        ready_s = max(ready_s, time.perf_counter() - t0)
                instance = instance_of[sr.req_idx] if instance_of is not None else 0
                task = asyncio.create_task(one(sr, body, len(prompt), parent, instance, ready_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if k + 1 < len(requests) and t0 + requests[k + 1].scheduled_s > time.perf_counter():
                    await asyncio.sleep(0)  # on time: the task starts (its send time, the POST) before the next body
            while tasks:  # (not gather: a stop must not cancel the requests in flight before their grace)
                done, _ = await asyncio.wait(set(tasks))
                for t in done:
                    t.result()  # a failure to write a record ends the replay
        except asyncio.CancelledError:
            stopping.set()
            await _settle(tasks, opts.stop_grace_s)
            raise


async def _settle(tasks: set[asyncio.Task[None]], grace_s: float) -> None:
    """At a stop: let TASKS (the requests in flight) finish within GRACE_S, then cancel the rest, each of
    which records itself as cancelled; a further stop signal ends the grace at once."""
    pending = set(tasks)
    if pending:
        with contextlib.suppress(asyncio.CancelledError):
            _, pending = await asyncio.wait(pending, timeout=grace_s)
    for t in pending:
        t.cancel()
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            continue

"""`kvtrace capture`: an OpenAI-compatible reverse proxy that records a privacy-safe Qwen-Bailian trace.

Two processes. The forwarder (this module, on capture/relay.py) only forwards, and hands each finished API
request (its body, the reply's bytes, status and timing) to the recorder process (capture/handoff.py,
capture/recorder.py), which does everything else: no recording work runs on the forwarding event loop.

Forwarding. Every request goes to the upstream unchanged: same method, path and query, the client's headers
(less the hop-by-hop ones and Host), the same body bytes; the upstream's status line, headers and body bytes
come back verbatim (no decompression: Content-Encoding passes through), a stream piece by piece as it arrives.
An upstream that cannot be reached gets a 502 with a JSON body saying so; a stream the upstream cuts short
is cut short to the client too.

Recording. POST /v1/completions and /v1/chat/completions are recorded, one line per finished request (a
completions `prompt` holding several prompts gives one line per prompt), when the upstream answered 200 with a
reply it could count: `timestamp` (s from the capture's start, at the request's arrival), `input_length` and
`output_length` (the reply's `usage`; a stream without usage: one output token per streamed chunk of a choice,
as vLLM and SGLang stream, less a chat stream's opening role chunk), `type` (capture/content.py), `hash_ids`
(capture/blocks.py: keyed chained hashes of the prompt's token ids, which capture/tokenize.py gets once the
request is answered), and `chat_id` (the line's index), `parent_chat_id` and `turn` from trace/sessions.py's
SessionLinker, fed the requests in the order their lines are written (each line says so: `linked_by`, so
that ingest's provenance says its sessions were inferred, by the capture). Lines are written as requests finish,
in the order their replies ended (a line whose token ids come back late holds back the ones after it), so the
file is in finish order, not arrival order (`kvtrace ingest` sorts by timestamp). Nothing else is written:
no prompt or output text, no token id, no header, no user identifier. Every request that is not recorded is
counted by reason: an error (the upstream unreachable, a non-200 status, a reply or stream that is not what
the API says, a stream cut short, the client gone) or skipped (no token ids, no counts in the reply, stopped).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from yarl import URL

from tongyi_trace.capture.blocks import load_salt
from tongyi_trace.capture.handoff import RecorderProcess, loop_factory
from tongyi_trace.capture.relay import Exchange, Relay
from tongyi_trace.errors import UsageError
from tongyi_trace.stops import STOP_SIGNALS

API_PATHS = ("/v1/completions", "/v1/chat/completions")
DEFAULT_DRAIN_S = 5.0


@dataclass(frozen=True)
class CaptureOptions:
    """What `kvtrace capture` was asked to do."""

    upstream_url: str
    out_path: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 0  # 0: a free port
    block_size_tokens: int = 16
    salt_file: Path | None = None
    tokenizer_file: Path | None = None
    overwrite: bool = False
    drain_s: float = DEFAULT_DRAIN_S  # at a stop, how long requests in flight may still finish


@dataclass
class CaptureSummary:
    """What a capture recorded and what it did not, with reasons (printed at its stop)."""

    url: str
    out_path: str
    upstream_url: str
    block_size: int
    num_recorded: int = 0
    num_errors: int = 0
    num_skipped: int = 0
    num_passthrough: int = 0  # requests on other paths, forwarded only
    num_distinct_blocks: int = 0
    num_input_length_mismatch: int = 0  # recorded, but usage.prompt_tokens != the token ids' count
    duration_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (PORT 0 = a free port) -> (host, port); UsageError for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8100 (port 0: a free one)")
    return host.strip("[]"), int(port)


def check_upstream(url: str) -> str:
    """The upstream base URL without a trailing slash; UsageError unless http(s)://host[:port][/prefix]."""
    u = URL(url)
    if u.scheme not in ("http", "https") or not u.host:
        raise UsageError(f"--upstream {url!r}: expected the server's base URL, e.g. http://127.0.0.1:8000")
    if u.query_string or u.fragment:
        raise UsageError(f"--upstream {url!r}: give the base URL without a query or fragment")
    return url.rstrip("/")


# ---- the proxy --------------------------------------------------------------------------------------------


class CaptureProxy:
    """The running proxy (module doc): `start` starts the recorder process, listens and returns its URL; `close`
    drains, has the recorder write the file's end, and returns the summary."""

    def __init__(self, opts: CaptureOptions) -> None:
        if opts.block_size_tokens <= 0:
            raise UsageError(f"--block-size {opts.block_size_tokens} must be a positive number of tokens")
        if not opts.drain_s >= 0:
            raise UsageError(f"--drain-s {opts.drain_s}: give a number of seconds >= 0")
        if opts.tokenizer_file is not None and not opts.tokenizer_file.is_file():
            raise UsageError(f"--tokenizer {opts.tokenizer_file}: no such file; give a tokenizer.json")
        self.opts = opts
        self.upstream = check_upstream(opts.upstream_url)
        self._salt = load_salt(opts.salt_file)
        self._recorder = RecorderProcess()
        self._relay = Relay(self.upstream, _recorded, self._done)
        self._t0 = 0.0
        self.summary = CaptureSummary(url="", out_path=str(opts.out_path), upstream_url=self.upstream,
                                      block_size=opts.block_size_tokens)
        self._unhanded: Counter[str] = Counter()  # requests the recorder could not be handed, by reason

    async def start(self) -> str:
        """Start the recorder (it opens the output file), listen, and return the proxy's base URL."""
        opts = self.opts
        await self._recorder.start({
            "out_path": str(opts.out_path), "overwrite": opts.overwrite, "upstream_url": self.upstream,
            "block_size_tokens": opts.block_size_tokens, "shared_ids": opts.salt_file is not None,
            "tokenizer_file": str(opts.tokenizer_file) if opts.tokenizer_file is not None else None}, self._salt)
        try:
            host, port = await self._relay.start(opts.listen_host, opts.listen_port)
        except OSError as e:  # a taken --listen: no file left behind
            await self._recorder.stop(0.0)
            opts.out_path.unlink(missing_ok=True)
            raise UsageError(f"--listen {opts.listen_host}:{opts.listen_port}: cannot listen "
                             f"({e.strerror or e}); choose another address or port 0") from None
        shown = f"[{host}]" if ":" in host else host
        self.summary.url = f"http://{shown}:{port}"
        self._t0 = time.perf_counter()
        return self.summary.url

    async def close(self) -> CaptureSummary:
        """Stop listening, let requests in flight finish for up to drain_s (then cut them: counted as
        skipped), let the recorder finish what it was handed in what is left of drain_s and close the file
        complete; the summary."""
        deadline = time.perf_counter() + self.opts.drain_s
        await self._relay.stop(self.opts.drain_s)
        counts = await self._recorder.stop(max(deadline - time.perf_counter(), 0.0))
        s = self.summary
        if counts is not None:
            for name, value in asdict(counts).items():
                setattr(s, name, value)
        elif self._recorder.num_handed:  # its counts died with it: what it was handed is counted as errors
            s.num_errors += self._recorder.num_handed
            s.errors[f"outcome not known: {self._recorder.lost}"] = self._recorder.num_handed
        for reason, num in self._unhanded.items():
            s.num_errors += num
            s.errors[reason] = s.errors.get(reason, 0) + num
        s.duration_s = round(time.perf_counter() - self._t0, 3)
        return s

    def _done(self, ex: Exchange) -> None:
        """An exchange ended: an API request is handed to the recorder (all else is its), any other counted."""
        if not _recorded(ex):
            self.summary.num_passthrough += 1
            return
        if ex.cut:
            meta: dict[str, Any] = {"k": "stopped", "path": ex.path}
            reply = b""
        else:
            meta = {"k": "req", "path": ex.path, "arrival_s": ex.arrival - self._t0, "error": ex.error,
                    "status": ex.status, "kind": "stream" if ex.streaming else "whole",
                    "encoding": ex.content_encoding}
            reply = ex.reply
        if not self._recorder.hand(meta, ex.body, reply):
            self._unhanded[f"not recorded: {self._recorder.lost}"] += 1


def _recorded(ex: Exchange) -> bool:
    """Whether EX is a request the capture records (its reply's bytes are kept for the recorder)."""
    return ex.method == b"POST" and ex.path in API_PATHS


async def serve_capture(opts: CaptureOptions, on_ready: Callable[[str], None], stop: asyncio.Event) -> CaptureSummary:
    """Run the proxy until STOP is set; ON_READY(url) once it listens. Returns the summary."""
    proxy = CaptureProxy(opts)
    url = await proxy.start()
    try:
        on_ready(url)
        await stop.wait()
    finally:
        summary = await proxy.close()
    return summary


def run_capture(opts: CaptureOptions, on_ready: Callable[[str], None]) -> CaptureSummary:
    """Run the proxy until Ctrl-C, SIGTERM or SIGHUP (in the main thread), then close the file complete
    and return the summary."""

    async def main() -> CaptureSummary:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        sigs = (signal.SIGINT, *STOP_SIGNALS) if threading.current_thread() is threading.main_thread() else ()
        previous = {sig: signal.getsignal(sig) for sig in sigs}
        for sig in sigs:
            loop.add_signal_handler(sig, stop.set)
        try:
            return await serve_capture(opts, on_ready, stop)
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main())

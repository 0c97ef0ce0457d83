"""`kvtrace capture`: an OpenAI-compatible reverse proxy that records a privacy-safe Qwen-Bailian trace.

Forwarding. Every request goes to the upstream unchanged: same method, path and query, the client's headers
(less the hop-by-hop ones and Host), the same body bytes; the upstream's status, headers and body bytes come
back unchanged (no decompression: Content-Encoding passes through), a stream chunk by chunk as it arrives.
An upstream that cannot be reached gets a 502 with a JSON body saying so; a stream the upstream cuts short
is cut short to the client too.

Recording. POST /v1/completions and /v1/chat/completions are recorded, one line per finished request (a
completions `prompt` holding several prompts gives one line per prompt), when the upstream answered 200 with a
reply it could count: `timestamp` (s from the capture's start, at the request's arrival), `input_length` and
`output_length` (the reply's `usage`; a stream without usage: one output token per streamed chunk of a choice,
as vLLM and SGLang stream, less a chat stream's opening role chunk), `type` (capture/content.py), `hash_ids`
(capture/blocks.py: keyed chained hashes of the prompt's token ids, which capture/tokenize.py gets while the
request runs), and `chat_id` (the line's index), `parent_chat_id` and `turn` from trace/sessions.py's
SessionLinker, fed the requests in the order their lines are written (each line says so: `linked_by`, so
that ingest's provenance says its sessions were inferred, by the capture). Lines are written as requests finish, so
the file is in finish order, not arrival order (`kvtrace ingest` sorts by timestamp). Nothing else is written:
no prompt or output text, no token id, no header, no user identifier. Every request that is not recorded is
counted by reason: an error (the upstream unreachable, a non-200 status, a reply or stream that is not what
the API says, a stream cut short, the client gone) or skipped (no token ids, no counts in the reply, stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from tongyi_trace.capture.blocks import DenseBlockIds, chained_block_hashes, load_salt
from tongyi_trace.capture.content import request_type
from tongyi_trace.capture.writer import LineWriter
from tongyi_trace.errors import KvtraceError, UsageError
from tongyi_trace.stops import STOP_SIGNALS
from tongyi_trace.trace.formats import CAPTURE_LINKER, LINKED_BY_FIELD

API_PATHS = ("/v1/completions", "/v1/chat/completions")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
DEFAULT_DRAIN_S = 5.0
_MAX_REASON = 300  # a reason (an upstream error message) kept up to this many characters


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


# ---- what a reply says ------------------------------------------------------------------------------------


@dataclass
class ReplyCounts:
    """The counts a reply gives: its usage object, output tokens counted per choice index, or its error."""

    usage: dict[str, Any] | None = None
    counted: Counter[int] = field(default_factory=Counter)
    error: str | None = None


def _loads(raw: bytes) -> Any:
    """The JSON value RAW holds: orjson's, else (what orjson refuses but the standard library reads: NaN, integers
    beyond 64 bits, UTF-16) the standard library's; ValueError when neither reads it."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _is_token_chunk(choice: dict[str, Any]) -> bool:
    """Whether a streamed choice carries a generated token: vLLM and SGLang stream one chunk per token (its
    text may be empty: a partial character, or an engine without detokenizer); a chat stream opens with a
    chunk that only says the role."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return "role" not in delta
    return "text" in choice


def parse_stream(raw: bytes) -> ReplyCounts:
    """The counts of a server-sent-event stream RAW (`data: {...}` lines, `data: [DONE]` at the end)."""
    out = ReplyCounts()
    for line in raw.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            obj = _loads(data)
        except ValueError:
            out.error = "stream chunk is not JSON"
            return out
        if not isinstance(obj, dict):
            out.error = "stream chunk is not a JSON object"
            return out
        if "error" in obj:
            out.error = "error in the stream"
            return out
        if isinstance(obj.get("usage"), dict):
            out.usage = obj["usage"]
        choices = obj.get("choices")
        if isinstance(choices, list):
            for c in choices:
                if isinstance(c, dict) and _is_token_chunk(c):
                    idx = c.get("index", 0)
                    out.counted[idx if isinstance(idx, int) else 0] += 1
    return out


def parse_reply(raw: bytes, content_encoding: str | None) -> ReplyCounts:
    """The counts of a whole (not streamed) JSON reply RAW, decoded per CONTENT_ENCODING (gzip, deflate)."""
    enc = (content_encoding or "identity").lower()
    try:
        if enc in ("gzip", "deflate"):
            raw = zlib.decompressobj(wbits=47).decompress(raw)
        elif enc != "identity":
            return ReplyCounts(error=f"reply in content encoding {enc[:20]!r}, cannot be read")
        obj = _loads(raw)
    except (ValueError, zlib.error):
        return ReplyCounts(error="reply is not JSON")
    if not isinstance(obj, dict):
        return ReplyCounts(error="reply is not a JSON object")
    return ReplyCounts(usage=obj["usage"] if isinstance(obj.get("usage"), dict) else None)


def _count(v: object) -> int | None:
    return v if type(v) is int and 0 <= v < 1 << 31 else None


# ---- the recorder -----------------------------------------------------------------------------------------


class Recorder:
    """Turns finished requests into trace lines: hashes, dense ids, session links, the line, the counts."""

    def __init__(self, writer: LineWriter, block_size_tokens: int, salt: bytes, shared_ids: bool,
                 summary: CaptureSummary) -> None:
        from tongyi_trace.trace.sessions import SessionLinker

        self.writer = writer
        self.block_size_tokens = block_size_tokens
        self._salt = salt
        self._dense = DenseBlockIds(shared=shared_ids)
        self._linker = SessionLinker(block_size_tokens)
        self.summary = summary

    def error(self, reason: str, num: int = 1) -> None:
        """Count NUM requests not recorded because of an error (REASON)."""
        self.summary.num_errors += num
        self._note(self.summary.errors, reason, num)

    def skip(self, reason: str, num: int = 1) -> None:
        """Count NUM requests not recorded for want of what a line needs (REASON)."""
        self.summary.num_skipped += num
        self._note(self.summary.skipped, reason, num)

    @staticmethod
    def _note(table: dict[str, int], reason: str, num: int) -> None:
        reason = " ".join(reason.split())[:_MAX_REASON]
        table[reason] = table.get(reason, 0) + num

    def record(self, arrival_s: float, token_ids: list[int], input_length: int, output_length: int,
               req_type: str) -> None:
        """Write the line of one finished request (module doc)."""
        ids = self._dense.ids(chained_block_hashes(token_ids, self.block_size_tokens, self._salt))
        link = self._linker.link(ids, input_length)
        chat_id = self.summary.num_recorded
        line = {"chat_id": chat_id, "parent_chat_id": link.parent, "timestamp": round(arrival_s, 6),
                "input_length": input_length, "output_length": output_length, "type": req_type,
                "turn": link.turn, LINKED_BY_FIELD: CAPTURE_LINKER, "hash_ids": ids}
        self.writer.write_line(orjson.dumps(line))
        self.summary.num_recorded += 1
        self.summary.num_distinct_blocks = len(self._dense)
        if input_length != len(token_ids):
            self.summary.num_input_length_mismatch += 1


# ---- the proxy --------------------------------------------------------------------------------------------


def _forward_headers(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def _bad_gateway(upstream: str, e: BaseException) -> web.Response:
    msg = f"kvtrace capture: upstream {upstream} unreachable ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    body = json.dumps({"error": {"message": msg, "type": "BadGateway", "code": 502}}).encode()
    return web.Response(status=502, body=body, content_type="application/json")


class CaptureProxy:
    """The running proxy (module doc): `start` listens and returns its URL; `close` drains and writes the
    file's end, returning the summary."""

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
        self._writer: LineWriter | None = None
        self._recorder: Recorder | None = None
        self._session: aiohttp.ClientSession | None = None  # forwarding: nothing added, nothing decoded
        self._tok_session: aiohttp.ClientSession | None = None  # the token source's own calls (/tokenize)
        self._runner: web.AppRunner | None = None
        self._token_source: Any = None
        self._inflight: set[asyncio.Task[Any]] = set()  # handlers running
        self._recording: set[asyncio.Task[None]] = set()  # finished requests being turned into lines
        self._t0 = 0.0
        self.summary = CaptureSummary(url="", out_path=str(opts.out_path), upstream_url=self.upstream,
                                      block_size=opts.block_size_tokens)

    async def start(self) -> str:
        """Open the output file, listen, and return the proxy's base URL."""
        from tongyi_trace.capture.tokenize import make_token_source

        self._writer = LineWriter(self.opts.out_path, overwrite=self.opts.overwrite)
        try:  # whatever fails from here (a bad --tokenizer, a taken --listen) leaves no session or file behind
            self._recorder = Recorder(self._writer, self.opts.block_size_tokens, self._salt,
                                      self.opts.salt_file is not None, self.summary)
            # One pooled session (keep-alive connections reused across requests and clients) and no cookie
            # jar: a proxy keeps no upstream cookie, or one client's cookie would go out with every other's.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30.0), auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
            self._tok_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120.0, sock_connect=30.0),
                                                      cookie_jar=aiohttp.DummyCookieJar())
            self._token_source = make_token_source(self.upstream, self._tok_session, self.opts.tokenizer_file)
            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.opts.listen_host, self.opts.listen_port)
            try:
                await site.start()
            except OSError as e:
                raise UsageError(f"--listen {self.opts.listen_host}:{self.opts.listen_port}: cannot listen "
                                 f"({e.strerror or e}); choose another address or port 0") from None
        except BaseException:
            await self._abort_start()
            raise
        sockets = self._runner.addresses
        host, port = sockets[0][0], sockets[0][1]
        shown = f"[{host}]" if ":" in host else host
        self.summary.url = f"http://{shown}:{port}"
        self._t0 = time.perf_counter()
        return self.summary.url

    async def _release(self) -> None:
        """Close the listener, the client sessions and the output file."""
        if self._runner is not None:
            await self._runner.cleanup()
        for session in (self._session, self._tok_session):
            if session is not None:
                await session.close()
        if self._writer is not None:
            self._writer.close()

    async def _abort_start(self) -> None:
        await self._release()
        if self._writer is not None:
            self.opts.out_path.unlink(missing_ok=True)

    async def close(self) -> CaptureSummary:
        """Stop listening, let requests in flight finish for up to drain_s (then cut them: counted as
        skipped), close the file complete; the summary."""
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
        deadline = time.perf_counter() + self.opts.drain_s
        for tasks in (self._inflight, self._recording):  # the handlers first: they start recordings
            if tasks:
                _, pending = await asyncio.wait(set(tasks), timeout=max(deadline - time.perf_counter(), 0.0))
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending)
        await self._release()
        self.summary.duration_s = round(time.perf_counter() - self._t0, 3)
        return self.summary

    # -- handlers --

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            if request.method == "POST" and request.path in API_PATHS:
                return await self._handle_api(request)
            self.summary.num_passthrough += 1
            body = await request.read()
            resp, _ = await self._forward(request, body, None)
            return resp
        finally:
            self._inflight.discard(task)

    async def _forward(self, request: web.Request, body: bytes,
                       on_error: Callable[[str], None] | None) -> tuple[web.StreamResponse, tuple[int, str, bytes]]:
        """Send REQUEST (BODY) upstream and its reply back; returns the response and (status, reply kind,
        reply bytes). Kind: "stream", "whole", or "error: REASON" (reported to ON_ERROR)."""
        assert self._session is not None
        url = URL(self.upstream + request.raw_path, encoded=True)  # raw_path: path and query as sent

        def failed(reason: str) -> None:
            if on_error is not None:
                on_error(reason)

        try:
            up_cm = self._session.request(request.method, url, headers=_forward_headers(request.headers),
                                          data=body if body else None, allow_redirects=False)
            up = await up_cm.__aenter__()
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            failed("upstream unreachable")
            return _bad_gateway(self.upstream, e), (502, "error", b"")
        try:
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    resp.headers.add(k, v)
            streaming = up.headers.get("Content-Type", "").startswith("text/event-stream")
            length = up.headers.get("Content-Length", "")
            if not streaming and length.isdigit():
                resp.content_length = int(length)
            keep = on_error is not None  # the reply's bytes are read for the record (API paths only)
            chunks: list[bytes] = []
            try:
                await resp.prepare(request)
            except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                failed("client disconnected")
                return resp, (up.status, "error", b"")
            while True:
                try:
                    chunk = await up.content.readany()
                except (aiohttp.ClientError, OSError, TimeoutError):
                    failed("stream cut short by the upstream" if streaming else "reply cut short by the upstream")
                    if request.transport is not None:
                        request.transport.close()  # the client sees the same cut
                    return resp, (up.status, "error", b"")
                if not chunk:
                    break
                if keep:
                    chunks.append(chunk)
                try:
                    await resp.write(chunk)
                except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                    failed("client disconnected")
                    return resp, (up.status, "error", b"")
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                await resp.write_eof()
            return resp, (up.status, "stream" if streaming else "whole", b"".join(chunks))
        finally:
            await up_cm.__aexit__(None, None, None)

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        arrival_s = time.perf_counter() - self._t0
        body = await request.read()
        errors: list[str] = []
        try:
            resp, reply = await self._forward(request, body, errors.append)
        except asyncio.CancelledError:
            assert self._recorder is not None
            self._recorder.skip("stopped before it finished", self._num_prompts(request.path, body))
            raise
        # The reply is out: reading the request, its token ids and the line happen after the handler returns
        # (a keep-alive connection's next request does not wait for them).
        task = asyncio.create_task(self._after(request.path, body, arrival_s, errors, reply,
                                               resp.headers.get("Content-Encoding")))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)
        return resp

    def _num_prompts(self, path: str, body: bytes) -> int:
        """How many lines the request would give (for the counts of one not recorded)."""
        return self._read_request(path, body)[2]

    def _read_request(self, path: str, body: bytes) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None, int]:
        """The request BODY as a JSON object (None when it is not one), its prompts (_prompts) and how many lines
        it would give."""
        try:
            parsed = _loads(body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return None, None, 1
        prompts = self._prompts(path, parsed)
        return parsed, prompts, max(len(prompts or ()), 1)

    async def _after(self, path: str, body: bytes, arrival_s: float, errors: list[str],
                     reply: tuple[int, str, bytes], content_encoding: str | None) -> None:
        """Count or record one forwarded request (never raises: a failure here is counted, with its reason)."""
        rec = self._recorder
        assert rec is not None
        status, kind, raw = reply
        parsed, prompts, num = self._read_request(path, body)
        try:
            if errors:
                rec.error(errors[0], num)
            elif status != 200:
                rec.error(f"upstream HTTP {status}", num)
            elif parsed is None:
                rec.skip("request body is not a JSON object", num)
            elif not prompts:
                rec.skip("request has no prompt (or messages) to record", num)
            else:
                counts = parse_stream(raw) if kind == "stream" else parse_reply(raw, content_encoding)
                if counts.error is not None:
                    rec.error(counts.error, num)
                else:
                    await self._record(path, parsed, prompts, arrival_s, counts, kind == "stream")
        except asyncio.CancelledError:
            rec.skip("stopped before it finished", num)
            raise
        except Exception as e:  # the proxy never stops for one request: counted, with what went wrong
            rec.skip(f"internal error ({type(e).__name__}: {e})", num)

    @staticmethod
    def _prompts(path: str, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The request bodies of each prompt (a completions batch gives several); None when there is none."""
        if path == "/v1/chat/completions":
            return [body] if isinstance(body.get("messages"), list) else None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
            return [{**body, "prompt": p} for p in prompt]  # a batch: several texts or token-id lists
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt):
            return [body]
        return None

    async def _record(self, path: str, body: dict[str, Any], prompts: list[dict[str, Any]], arrival_s: float,
                      counts: ReplyCounts, streamed: bool) -> None:
        rec = self._recorder
        assert rec is not None
        num = len(prompts)
        n = body.get("n", 1) if type(body.get("n", 1)) is int else 1
        usage = counts.usage or {}
        ids_list: list[list[int]] = []
        for p in prompts:
            try:
                ids_list.append(await self._token_source.prompt_token_ids(path, p))
            except KvtraceError as e:
                rec.skip(f"no token ids: {e}", num)
                return
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
                rec.skip(f"no token ids: {type(e).__name__}", num)
                return
        req_type = request_type(path, body)
        if num == 1:
            inp = _count(usage.get("prompt_tokens"))
            out = _count(usage.get("completion_tokens"))
            if out is None and counts.counted:
                out = sum(counts.counted.values())
            if out is None:
                rec.skip("reply without usage (output length unknown)")
                return
            rec.record(arrival_s, ids_list[0], inp if inp is not None else len(ids_list[0]), out, req_type)
            return
        if not streamed:
            rec.skip("batched prompts in a reply without per-prompt counts (send stream: true)", num)
            return
        for i, ids in enumerate(ids_list):  # vLLM numbers the choices of prompt i from i * n
            out = sum(counts.counted[i * n + j] for j in range(max(n, 1)))
            rec.record(arrival_s, ids, len(ids), out, req_type)


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

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a tenth less CPU per forwarded request than asyncio's:
    docs/capture.md#overhead), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop

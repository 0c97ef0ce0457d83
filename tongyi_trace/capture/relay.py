"""The capture's forwarding path: a lean HTTP/1.1 relay on asyncio protocols (uvloop where installed), with
httptools' parsers (llhttp, the C parser of Node.js) and no task, future or response object per request.

A client's request is read whole (its body at most MAX_BODY_BYTES), then sent upstream on a pooled keep-alive
connection: the request line with the upstream's path prefix, Host set to the upstream's, the client's other
headers less the hop-by-hop ones, Content-Length, and the body bytes. The upstream's reply goes back to the
client verbatim (status line, headers, framing and body bytes, each piece written as it arrives), and is parsed
on the side only to find its end, its status, its Content-Type and Content-Encoding, and (for a request the
proxy records) its body bytes. Errors: an upstream that cannot be reached gets a 502 with a JSON body saying
so; a reply the upstream cuts short is cut short to the client (its connection closed); a client gone closes
the upstream connection; a pooled connection that the upstream closed before answering a byte is retried once
on a new one. Requests pipelined on one connection are answered in order. Every exchange ends in ON_DONE
(answered, failed or cut at the stop), once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httptools
from yarl import URL

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length",
                        b"expect", b"proxy-connection"})
MAX_BODY_BYTES = 1 << 30
IDLE_S = 4.0  # an idle upstream connection is reused this long (uvicorn, vLLM's server, closes one after 5 s)
_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})
_REASONS = {400: b"Bad Request", 413: b"Payload Too Large", 502: b"Bad Gateway"}


@dataclass(eq=False)
class Exchange:
    """One request and its reply as the relay saw them (what the recorder needs of them)."""

    arrival: float  # time.perf_counter() at the request's first byte
    method: bytes = b""
    target: bytes = b""  # as sent: path and query
    version: str = "1.1"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body_parts: list[bytes] = field(default_factory=list)
    keep_body: bool = False  # keep the reply's body bytes (the proxy records this request)
    status: int = 0
    streaming: bool = False  # the reply is text/event-stream
    content_encoding: str | None = None
    reply_parts: list[bytes] = field(default_factory=list)
    error: str | None = None  # why it failed (the client saw the upstream's failure as it was)
    cut: bool = False  # cut at the stop, unanswered
    done: bool = False

    @property
    def path(self) -> str:
        """The target's path (no query), as text."""
        return self.target.split(b"?", 1)[0].decode("latin-1")

    @property
    def body(self) -> bytes:
        """The request's body bytes."""
        return b"".join(self.body_parts)

    @property
    def reply(self) -> bytes:
        """The reply's body bytes (unchunked; as encoded by the upstream), when kept."""
        return b"".join(self.reply_parts)


def _simple_response(status: int, body: bytes) -> bytes:
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (status, _REASONS.get(status, b"Error"), len(body)) + body)


def _error_body(status: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


class Relay:
    """The relay: `start` listens; `stop` stops listening, lets exchanges in flight finish for DRAIN_S and cuts
    the rest. WANTS_BODY(exchange) says, when a request is complete, whether its reply's bytes are kept;
    ON_DONE(exchange) is called once per exchange at its end."""

    def __init__(self, upstream_url: str, wants_body: Callable[[Exchange], bool],
                 on_done: Callable[[Exchange], None]) -> None:
        u = URL(upstream_url)
        self.upstream_url = upstream_url
        self._host = u.host or ""
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        self._prefix = u.raw_path.rstrip("/").encode()
        default = (u.scheme == "https" and self._port == 443) or (u.scheme == "http" and self._port == 80)
        shown = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = (shown if default else f"{shown}:{self._port}").encode()
        self.wants_body = wants_body
        self.on_done = on_done
        self._idle: deque[tuple[float, _Upstream]] = deque()
        self._clients: set[_Client] = set()
        self._orphans: set[_Upstream] = set()  # replies finishing for a client gone after their last event
        self._server: asyncio.AbstractServer | None = None
        self._num_active = 0
        self._quiet: asyncio.Event | None = None  # set when no exchange is in flight (during the stop)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on HOST:PORT (0: a free port); the address listened on. OSError when it cannot."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Client(self), host, port, backlog=1024)
        addr = self._server.sockets[0].getsockname()
        return str(addr[0]), int(addr[1])

    async def stop(self, drain_s: float) -> None:
        """Stop listening, close idle client connections, let exchanges in flight finish for up to DRAIN_S, cut
        the rest (ON_DONE with exchange.cut) and close every connection."""
        if self._server is not None:
            self._server.close()
        for client in list(self._clients):
            client.closing = True
            if client.idle:
                client.transport.close()
        if self._num_active:
            self._quiet = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet.wait(), timeout=drain_s)
        for client in list(self._clients):
            client.cut()
        for up in list(self._orphans):
            up.cut()
        while self._idle:
            self._idle.popleft()[1].transport.close()
        if self._server is not None:
            await self._server.wait_closed()

    # -- the upstream side --

    def _began(self) -> None:
        self._num_active += 1

    def _ended(self, ex: Exchange) -> None:
        if ex.done:
            return
        ex.done = True
        self._num_active -= 1
        try:
            self.on_done(ex)
        finally:
            if self._quiet is not None and not self._num_active:
                self._quiet.set()

    def send(self, ex: Exchange, client: _Client, retried: bool = False) -> None:
        """Send EX upstream for CLIENT: on an idle pooled connection at once, else on a new one."""
        now = time.perf_counter()
        while self._idle:
            since, up = self._idle.pop()
            if now - since < IDLE_S and not up.transport.is_closing():
                up.begin(ex, client, self._request_bytes(ex), reused=not retried)
                return
            up.transport.close()
        asyncio.get_running_loop().create_task(self._connect_and_send(ex, client))

    async def _connect_and_send(self, ex: Exchange, client: _Client) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(lambda: _Upstream(self), self._host, self._port, ssl=self._ssl)
        except (OSError, ssl.SSLError, TimeoutError) as e:
            if client.gone:
                client.finish(ex, "client disconnected")
                return
            msg = (f"kvtrace capture: upstream {self.upstream_url} unreachable ({type(e).__name__}: "
                   f"{' '.join(str(e).split())[:200]})")
            client.transport.write(_simple_response(502, _error_body(502, msg, "BadGateway")))
            ex.status = 502
            client.finish(ex, "upstream unreachable")
            return
        if client.gone:
            up.transport.close()
            client.finish(ex, "client disconnected")
            return
        up.begin(ex, client, self._request_bytes(ex), reused=False)

    def _request_bytes(self, ex: Exchange) -> bytes:
        body = ex.body
        parts = [b"%s %s%s HTTP/%s\r\nHost: %s\r\n" % (ex.method, self._prefix, ex.target, ex.version.encode(),
                                                      self._host_header)]
        for name, value in ex.headers:
            if name.lower() not in HOP_BY_HOP:
                parts.append(b"%s: %s\r\n" % (name, value))
        if body or ex.method in _BODY_METHODS:
            parts.append(b"Content-Length: %d\r\n" % len(body))
        parts.append(b"\r\n")
        parts.append(body)
        return b"".join(parts)

    def release(self, up: _Upstream) -> None:
        """UP answered in full and may be reused."""
        self._idle.append((time.perf_counter(), up))


class _Upstream(asyncio.Protocol):
    """One connection to the upstream: relays its replies to the client of the exchange under way."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.ex: Exchange | None = None
        self.client: _Client | None = None
        self.request = b""
        self.reused = False
        self.num_received = 0
        self.framed = False
        self.headers_done = False
        self.ended_reuse: bool | None = None  # the reply under way ended in the data being relayed (keep-alive?)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def begin(self, ex: Exchange, client: _Client, request: bytes, reused: bool) -> None:
        """Send REQUEST (EX's, for CLIENT) and relay its reply."""
        self.ex, self.client, self.request, self.reused = ex, client, request, reused
        self.num_received, self.framed, self.headers_done = 0, False, False
        client.upstream = self
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        client, ex = self.client, self.ex
        if client is None or ex is None:  # nothing asked: not HTTP
            self.transport.close()
            return
        self.num_received += len(data)
        self.ended_reuse = None
        try:
            self.parser.feed_data(data)  # parsed before it goes on: the reply's end is seen (on_message_complete)
        except httptools.HttpParserError:
            if not client.gone:
                client.transport.write(data)
            self._fail("reply is not HTTP")
            return
        if self.ended_reuse is not None:  # handed on (to the recorder) before the client has the reply's last
            self.relay._ended(ex)  # byte: a kill -9 of the forwarder after the client has it loses no line
        if not client.gone:
            client.transport.write(data)
        if self.ended_reuse is not None:
            self._complete(reuse=self.ended_reuse)

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        ex = self.ex
        assert ex is not None
        if n == b"content-type":
            ex.streaming = value.startswith(b"text/event-stream")
        elif n == b"content-encoding":
            ex.content_encoding = value.decode("latin-1")
        elif n == b"content-length" or (n == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        ex = self.ex
        assert ex is not None
        ex.status = self.parser.get_status_code()
        self.headers_done = True
        if ex.method == b"HEAD":  # no body follows; the parser does not know: this connection is not reused
            self._complete(reuse=False)

    def on_body(self, body: bytes) -> None:
        ex = self.ex
        if ex is not None and ex.keep_body:
            ex.reply_parts.append(body)

    def on_message_complete(self) -> None:
        if self.ex is not None:  # completed in data_received, once the last bytes are on their way
            self.ended_reuse = self.parser.should_keep_alive()

    def cut(self) -> None:
        """The stop: the reply under way ends unanswered (exchange.cut); the connection closes."""
        ex = self.ex
        self.ex = self.client = None
        self.relay._orphans.discard(self)
        self.transport.close()
        if ex is not None:
            ex.cut = True
            self.relay._ended(ex)

    def _complete(self, reuse: bool) -> None:
        ex, client = self.ex, self.client
        self.ex = self.client = None
        self.relay._orphans.discard(self)
        if client is not None:
            client.upstream = None
        if reuse and not self.transport.is_closing():
            self.relay.release(self)
        else:
            self.transport.close()
        if client is not None and ex is not None:
            client.finish(ex, None)

    def _fail(self, reason: str) -> None:
        """The reply went wrong: the client's connection is closed (it sees the cut), EX ends with REASON."""
        ex, client = self.ex, self.client
        self.ex = self.client = None
        self.relay._orphans.discard(self)
        self.transport.close()
        if client is not None and ex is not None:
            client.upstream = None
            client.transport.close()
            client.finish(ex, reason)

    def connection_lost(self, exc: Exception | None) -> None:
        ex, client = self.ex, self.client
        if ex is None or client is None:
            return
        if self.num_received == 0 and self.reused and not client.gone:  # a stale pooled connection: once more
            self.ex = self.client = None
            client.upstream = None
            self.relay.send(ex, client, retried=True)
        elif self.headers_done and not self.framed:  # a reply that ends with its connection
            self._complete(reuse=False)
        elif self.num_received == 0:  # nothing relayed yet: the client gets a 502 saying so
            self.ex = self.client = None
            client.upstream = None
            msg = f"kvtrace capture: upstream {self.relay.upstream_url} closed the connection without a reply"
            client.transport.write(_simple_response(502, _error_body(502, msg, "BadGateway")))
            ex.status = 502
            client.finish(ex, "upstream closed the connection without a reply")
        else:
            self._fail("stream cut short by the upstream" if ex.streaming else "reply cut short by the upstream")

    def pause_writing(self) -> None:  # the upstream reads slowly: stop reading the client
        if self.client is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.transport.resume_reading()


def _stream_ended(ex: Exchange) -> bool:
    """Whether EX's reply is a stream whose last event (`data: [DONE]`) has come."""
    return ex.streaming and bool(ex.reply_parts) and ex.reply_parts[-1].rstrip().endswith(b"data: [DONE]")


class _Client(asyncio.Protocol):
    """One client connection: parses its requests, has them relayed in order."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: _Upstream | None = None
        self.current: Exchange | None = None  # being relayed
        self.queue: deque[Exchange] = deque()  # complete, waiting (pipelined)
        self.reading: Exchange | None = None  # being read
        self.url_parts: list[bytes] = []
        self.body_bytes = 0
        self.keep_alive = True
        self.closing = False  # the relay stops: close once idle
        self.gone = False

    @property
    def idle(self) -> bool:
        """No request under way or being read."""
        return self.current is None and not self.queue and self.reading is None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.relay._clients.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "kvtrace capture: protocol upgrades are not forwarded")
        except httptools.HttpParserError as e:
            self._refuse(400, f"kvtrace capture: not an HTTP/1.1 request ({e})")

    def _refuse(self, status: int, message: str) -> None:
        self.reading = None
        if self.current is None:
            self.transport.write(_simple_response(status, _error_body(status, message, "BadRequest")))
        self.keep_alive = False
        if self.idle:
            self.transport.close()

    def on_message_begin(self) -> None:
        self.reading = Exchange(arrival=time.perf_counter())
        self.url_parts = []
        self.body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.url_parts.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.reading is not None:
            self.reading.headers.append((name, value))

    def on_headers_complete(self) -> None:
        ex = self.reading
        if ex is None:
            return
        ex.method = self.parser.get_method()
        ex.target = b"".join(self.url_parts)
        ex.version = self.parser.get_http_version()
        for name, value in ex.headers:
            if name.lower() == b"expect" and value.lower() == b"100-continue":
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        ex = self.reading
        if ex is None:
            return
        self.body_bytes += len(body)
        if self.body_bytes > MAX_BODY_BYTES:
            self._refuse(413, f"kvtrace capture: request body over {MAX_BODY_BYTES} bytes")
            return
        ex.body_parts.append(body)

    def on_message_complete(self) -> None:
        ex = self.reading
        if ex is None:
            return
        self.reading = None
        if not self.parser.should_keep_alive():
            self.keep_alive = False
        ex.keep_body = self.relay.wants_body(ex)
        self.relay._began()
        if self.current is None:
            self.current = ex
            self.relay.send(ex, self)
        else:
            self.queue.append(ex)

    def finish(self, ex: Exchange, error: str | None) -> None:
        """EX ended (ERROR: why it failed); the next pipelined request goes, or the connection closes."""
        ex.error = error
        if self.current is ex:
            self.current = None
        self.relay._ended(ex)
        if self.gone:
            return
        if error is not None and ex.status != 502:  # the reply is broken: the connection goes with it
            self.transport.close()
            return
        if self.queue:
            self.current = self.queue.popleft()
            self.relay.send(self.current, self)
        elif not self.keep_alive or self.closing:
            self.transport.close()

    def cut(self) -> None:
        """The stop: end what is under way or waiting, unanswered (exchange.cut), and close."""
        self.closing = True
        if self.upstream is not None:
            self.upstream.ex = self.upstream.client = None
            self.upstream.transport.close()
            self.upstream = None
        for ex in [*([self.current] if self.current is not None else []), *self.queue]:
            ex.cut = True
            self.relay._ended(ex)
        self.current, self.queue = None, deque()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self.relay._clients.discard(self)
        pending = [*([self.current] if self.current is not None else []), *self.queue]
        self.current, self.queue = None, deque()
        if pending and self.upstream is not None and _stream_ended(pending[0]):
            # the client left after the stream's last event (an SSE client may close on `data: [DONE]`): only
            # the upstream's chunk terminator is still to come, and with it the exchange ends as answered
            pending.pop(0)
            self.relay._orphans.add(self.upstream)
            self.upstream = None
        if self.upstream is not None:
            self.upstream.ex = self.upstream.client = None
            self.upstream.transport.close()
            self.upstream = None
        for ex in pending:
            if not ex.done:
                ex.error = "client disconnected"
                self.relay._ended(ex)

    def pause_writing(self) -> None:  # the client reads slowly: stop reading the upstream
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.resume_reading()

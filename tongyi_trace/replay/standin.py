"""A stand-in OpenAI-compatible endpoint for tests and benchmarks of the replay CLIENT (not an engine).

It speaks the subset of vLLM's API that replay uses: GET /health, GET /v1/models (with max_model_len),
GET /tokenizer_info (only with first_special_id, as vLLM with --enable-tokenizer-info-endpoint),
GET /metrics (vllm:prefix_cache_{queries,hits}_total, vllm:cache_config_info), and streaming
POST /v1/completions with a final usage chunk. Its "cache" is an unlimited prefix cache of full blocks
(chained hashes of block_size-token blocks; a hit never covers the last prompt token), enough to check
that identical block ids reach the server as identical tokens. Every `fail_every`-th completion request
is answered with HTTP 500, to exercise failure records.

Fault injection (`fault`, applied to every `fault_every`-th completion request; see FAULTS): refuse
(close the connection without a reply), 500, garbage (a 200 stream of bytes that are not SSE JSON),
non_object (`data: 5`, `data: [1,2]` chunks), bad_usage (`usage` not an object), truncated (the stream
ends cleanly but without usage or [DONE]), close (the socket is cut mid-stream), hang (the request is
read and never answered), trickle (one byte every 0.2 s, forever), huge_line (a 4 MiB line without a
newline), metrics (every completion is fine but GET /metrics answers nonsense: NaN counters, a negative
block size, hits above queries). `hang_metrics_after=N`: GET /metrics never answers after N scrapes.
`throttle=N`: each request's first N attempts are answered `throttle_status` (429 by default) with a
`Retry-After: retry_after` header (none when retry_after is None), as a server over its rate limit.
Run: python -m tongyi_trace.replay.standin --port N [--fault MODE].
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL_NAME = "stand-in"
FAULTS = ("refuse", "500", "garbage", "non_object", "bad_usage", "truncated", "close", "hang", "trickle",
          "huge_line", "metrics")
_NONSENSE_METRICS = (b'vllm:prefix_cache_queries_total{engine="0"} NaN\n'
                     b'vllm:prefix_cache_hits_total{engine="0"} 1e300\n'
                     b'vllm:prefix_cache_hits_total banana\n'
                     b'vllm:cache_config_info{block_size="-3",num_gpu_blocks="lots"} 1.0\n'
                     b'}{ not prometheus at all \xff\n')


class StandInState:
    """Counters and the block cache shared by the handler threads."""

    def __init__(self, block_size: int = 32, max_model_len: int = 1 << 20, fail_every: int = 0,
                 token_delay_s: float = 0.0, num_gpu_blocks: int = 1 << 20, api_key: str | None = None,
                 fault: str | None = None, fault_every: int = 1, hang_metrics_after: int = 0,
                 first_special_id: int | None = None, throttle: int = 0, throttle_status: int = 429,
                 retry_after: str | None = "1") -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.fail_every = fail_every
        self.token_delay_s = token_delay_s
        self.num_gpu_blocks = num_gpu_blocks
        self.api_key = api_key
        self.fault = fault
        self.fault_every = max(1, fault_every)
        self.hang_metrics_after = hang_metrics_after  # > 0: GET /metrics hangs after that many scrapes
        # set: GET /tokenizer_info answers as vLLM with --enable-tokenizer-info-endpoint, two special tokens
        # from this id on (the ordinary vocabulary below it); None: 404, as vLLM by default
        self.first_special_id = first_special_id
        self.throttle = throttle
        self.throttle_status = throttle_status
        self.retry_after = retry_after
        self.attempts: dict[str, list[float]] = {}  # X-Request-Id -> the time.monotonic() of each POST received
        self.max_token_id = -1  # the largest prompt token id received
        self.num_metrics = 0
        self.stop = threading.Event()  # set at shutdown: releases hanging / trickling handlers
        self.lock = threading.Lock()
        self.cache: set[bytes] = set()
        self.num_completions = 0
        self.queries_tokens = 0
        self.hits_tokens = 0
        self.completed: list[str] = []  # X-Request-Id of every fully answered request
        self.faulted: list[str] = []  # X-Request-Id of every request answered with the fault

    def lookup_and_insert(self, prompt: list[int]) -> int:
        """Cached tokens of PROMPT (full chained blocks, never the last token); caches its full blocks."""
        bs = self.block_size
        h = b""
        hashes = []
        for i in range(len(prompt) // bs):
            h = hashlib.blake2b(h + json.dumps(prompt[i * bs:(i + 1) * bs]).encode(), digest_size=16).digest()
            hashes.append(h)
        max_blocks = (len(prompt) - 1) // bs
        with self.lock:
            hit = 0
            while hit < min(len(hashes), max_blocks) and hashes[hit] in self.cache:
                hit += 1
            self.cache.update(hashes)
            self.queries_tokens += len(prompt)
            self.hits_tokens += hit * bs
        return hit * bs


def _handler(state: StandInState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, streamed with chunked transfer encoding like uvicorn

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _json(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _count_metrics(self) -> int:
            with state.lock:
                state.num_metrics += 1
                return state.num_metrics

        def _raw(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream_start(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _fault(self, fault: str) -> None:
            """Answer the current completion request with FAULT (see FAULTS)."""
            if fault == "refuse":
                self.close_connection = True
                return
            if fault == "500":
                self._json(500, {"error": {"message": "stand-in [/x] boom: injected failure"}})
                return
            if fault == "hang":
                state.stop.wait(120)
                self.close_connection = True
                return
            self._stream_start()
            token = b'data: {"choices": [{"index": 0, "text": ""}]}\n\n'
            if fault == "garbage":
                self._chunk(b"data: {not json \xff\xfe\n\n\x00\x01garbage\n")
            elif fault == "non_object":
                self._chunk(token + b"data: 5\n\ndata: [1,2]\n\n")
            elif fault == "bad_usage":
                self._chunk(token + b'data: {"choices": [], "usage": "lots"}\n\ndata: [DONE]\n\n')
            elif fault == "truncated":
                self._chunk(token)
            elif fault == "close":
                self._chunk(token)
                self.wfile.write(b"ff\r\ndata: {\"cho")  # a chunk cut short, then the socket closes
                self.wfile.flush()
                self.close_connection = True
                return
            elif fault == "trickle":
                while not state.stop.wait(0.2):
                    self._chunk(b":")
            elif fault == "huge_line":
                self._chunk(b"data: " + b"7" * (4 << 20))
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _authorized(self) -> bool:
            if state.api_key is None or self.headers.get("Authorization") == f"Bearer {state.api_key}":
                return True
            self._json(401, {"error": {"message": "invalid API key"}})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/health":
                self._json(200, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model",
                                                             "max_model_len": state.max_model_len}]})
            elif self.path == "/tokenizer_info" and state.first_special_id is not None:
                first = state.first_special_id
                self._json(200, {"tokenizer_class": "StandInTokenizer", "added_tokens_decoder": {
                    str(first): {"content": "<|endoftext|>", "special": True},
                    str(first + 1): {"content": "<|im_start|>", "special": True}}})
            elif self.path == "/metrics" and state.hang_metrics_after and self._count_metrics() > \
                    state.hang_metrics_after:
                state.stop.wait(120)
                self.close_connection = True
            elif self.path == "/metrics" and state.fault == "metrics":
                self._raw(200, "text/plain", _NONSENSE_METRICS)
            elif self.path == "/metrics":
                text = (f"vllm:prefix_cache_queries_total{{engine=\"0\"}} {float(state.queries_tokens)}\n"
                        f"vllm:prefix_cache_hits_total{{engine=\"0\"}} {float(state.hits_tokens)}\n"
                        f"vllm:cache_config_info{{block_size=\"{state.block_size}\","
                        f"num_gpu_blocks=\"{state.num_gpu_blocks}\"}} 1.0\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if self.path != "/v1/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with state.lock:
                state.num_completions += 1
                n = state.num_completions
            request_id = self.headers.get("X-Request-Id", "")
            with state.lock:
                tries = state.attempts.setdefault(request_id, [])
                tries.append(time.monotonic())
            if len(tries) <= state.throttle:
                self.send_response(state.throttle_status)
                body = json.dumps({"error": {"message": "stand-in: too many requests"}}).encode()
                if state.retry_after is not None:
                    self.send_header("Retry-After", state.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if state.fault not in (None, "metrics") and n % state.fault_every == 0:
                with state.lock:
                    state.faulted.append(request_id)
                try:
                    self._fault(str(state.fault))
                except OSError:
                    self.close_connection = True  # the client gave up (its timeout): nothing more to send
                return
            if state.fail_every and n % state.fail_every == 0:
                self._json(500, {"error": {"message": f"stand-in failure of request #{n}"}})
                return
            prompt = req["prompt"]
            if len(prompt) + req["max_tokens"] > state.max_model_len:
                self._json(400, {"error": {"message": "prompt too long for max_model_len"}})
                return
            cached = state.lookup_and_insert(prompt)
            state.max_token_id = max(state.max_token_id, max(prompt, default=-1))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(req["max_tokens"]):
                if state.token_delay_s:
                    time.sleep(state.token_delay_s)
                chunk = {"choices": [{"index": 0, "text": "", "finish_reason":
                                      "length" if i == req["max_tokens"] - 1 else None}]}
                self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": req["max_tokens"],
                                              "prompt_tokens_details": {"cached_tokens": cached}}}
            self._chunk(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self._chunk(b"")
            with state.lock:
                state.completed.append(request_id)

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the default backlog of 5 resets connections at 100 req/s
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # a client that went away (Ctrl-C test) is not an error of the stand-in


def serve(state: StandInState, port: int = 0) -> ThreadingHTTPServer:
    """Start the stand-in on 127.0.0.1:PORT (0 = free port) in a daemon thread; return the server."""
    httpd = _Server(("127.0.0.1", port), _handler(state))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main() -> None:
    """Command line: serve until killed, printing the URL first."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=1 << 20)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--token-delay-ms", type=float, default=0.0)
    ap.add_argument("--fault", choices=FAULTS, default=None)
    ap.add_argument("--fault-every", type=int, default=1)
    a = ap.parse_args()
    httpd = serve(StandInState(a.block_size, a.max_model_len, a.fail_every, a.token_delay_ms / 1e3,
                               fault=a.fault, fault_every=a.fault_every), a.port)
    print(f"http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        httpd.shutdown()


if __name__ == "__main__":
    main()

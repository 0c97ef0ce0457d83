"""`kvtrace capture`'s recorder: turns the finished requests the forwarder hands it (capture/handoff.py) into
trace lines, in a process of its own (`python -m tongyi_trace.capture.recorder IN_FD OUT_FD`).

For each request: the request body read as JSON, its prompts, the reply's counts (its `usage`, or counted from
the stream), the prompts' token ids (capture/tokenize.py: given, the upstream's /tokenize or a local
tokenizer), keyed chained block hashes and dense ids (capture/blocks.py), the session link (trace/sessions.py's
SessionLinker, fed the requests in the order they were handed: their replies' ends), the line, written and
flushed as soon as its token ids are in and the lines before it are written
(capture/writer.py). Every request not recorded is counted with its reason (proxy.py's module doc lists
them). At the forwarder's stop it lets the recordings under way finish for the drain time and cuts the rest
(counted as skipped); when the forwarder is gone without one (killed), nobody waits on it and it finishes every
recording it was handed (each /tokenize is bounded by its client timeout). Then it closes the file complete and
answers its counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tongyi_trace.capture.blocks import DenseBlockIds, chained_block_hashes
from tongyi_trace.capture.content import request_type
from tongyi_trace.capture.handoff import RecorderCounts, counts_json, loop_factory, read_frame
from tongyi_trace.capture.writer import LineWriter
from tongyi_trace.errors import KvtraceError
from tongyi_trace.trace.formats import CAPTURE_LINKER, LINKED_BY_FIELD

_MAX_REASON = 300  # a reason (an upstream error message) kept up to this many characters
_READ_LIMIT = 1 << 24
STOPPED = "stopped before it finished"

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


def request_prompts(path: str, body: bytes) -> tuple[dict[str, Any] | None, list[dict[str, Any]] | None, int]:
    """The request BODY as a JSON object (None when it is not one), the request bodies of each of its prompts (a
    completions batch gives several; None when there is none) and how many lines it would give."""
    try:
        parsed = _loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return None, None, 1
    prompts: list[dict[str, Any]] | None = None
    if path == "/v1/chat/completions":
        prompts = [parsed] if isinstance(parsed.get("messages"), list) else None
    else:
        prompt = parsed.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
            prompts = [{**parsed, "prompt": p} for p in prompt]  # a batch: several texts or token-id lists
        elif isinstance(prompt, str) or (isinstance(prompt, list) and prompt):
            prompts = [parsed]
    return parsed, prompts, max(len(prompts or ()), 1)


# ---- the lines --------------------------------------------------------------------------------------------


class Recorder:
    """Turns finished requests into trace lines: hashes, dense ids, session links, the line, the counts."""

    def __init__(self, writer: LineWriter, block_size_tokens: int, salt: bytes, shared_ids: bool,
                 token_source: Any) -> None:
        from tongyi_trace.trace.sessions import SessionLinker

        self.writer = writer
        self.block_size_tokens = block_size_tokens
        self._salt = salt
        self._dense = DenseBlockIds(shared=shared_ids)
        self._linker = SessionLinker(block_size_tokens)
        self._token_source = token_source
        self.counts = RecorderCounts()
        # Lines are written in the order the requests were handed (their replies' ends), whatever order their
        # token ids come back in, so that the linker sees a conversation's turns in order.
        self._upto = 0  # the hand-off number whose lines are written next
        self._ended: set[int] = set()  # later numbers done with (written, counted or cut)
        self._turns: dict[int, asyncio.Future[None]] = {}  # numbers whose lines wait for their turn

    @property
    def waiting(self) -> set[int]:
        """The hand-off numbers whose lines are ready and wait for earlier ones."""
        return set(self._turns)

    async def _my_turn(self, seq: int) -> None:
        if seq != self._upto:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._turns[seq] = fut
            try:
                await fut
            finally:
                del self._turns[seq]

    def _end_turn(self, seq: int) -> None:
        self._ended.add(seq)
        while self._upto in self._ended:
            self._ended.discard(self._upto)
            self._upto += 1
        fut = self._turns.get(self._upto)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def error(self, reason: str, num: int = 1) -> None:
        """Count NUM requests not recorded because of an error (REASON)."""
        self.counts.num_errors += num
        self._note(self.counts.errors, reason, num)

    def skip(self, reason: str, num: int = 1) -> None:
        """Count NUM requests not recorded for want of what a line needs (REASON)."""
        self.counts.num_skipped += num
        self._note(self.counts.skipped, reason, num)

    @staticmethod
    def _note(table: dict[str, int], reason: str, num: int) -> None:
        reason = " ".join(reason.split())[:_MAX_REASON]
        table[reason] = table.get(reason, 0) + num

    def record(self, arrival_s: float, token_ids: list[int], input_length: int, output_length: int,
               req_type: str) -> None:
        """Write the line of one finished request (proxy.py's module doc)."""
        ids = self._dense.ids(chained_block_hashes(token_ids, self.block_size_tokens, self._salt))
        link = self._linker.link(ids, input_length)
        chat_id = self.counts.num_recorded
        line = {"chat_id": chat_id, "parent_chat_id": link.parent, "timestamp": round(arrival_s, 6),
                "input_length": input_length, "output_length": output_length, "type": req_type,
                "turn": link.turn, LINKED_BY_FIELD: CAPTURE_LINKER, "hash_ids": ids}
        self.writer.write_line(orjson.dumps(line))
        self.counts.num_recorded += 1
        self.counts.num_distinct_blocks = len(self._dense)
        if input_length != len(token_ids):
            self.counts.num_input_length_mismatch += 1

    async def finished(self, seq: int, meta: dict[str, Any], body: bytes, raw: bytes) -> None:
        """Count or record one forwarded request (a "req" frame, the SEQ-th handed; never raises but when
        cancelled: a failure here is counted, with its reason)."""
        path = meta["path"]
        parsed, prompts, num = request_prompts(path, body)
        try:
            if meta.get("error"):
                self.error(meta["error"], num)
            elif meta["status"] != 200:
                self.error(f"upstream HTTP {meta['status']}", num)
            elif parsed is None:
                self.skip("request body is not a JSON object", num)
            elif not prompts:
                self.skip("request has no prompt (or messages) to record", num)
            else:
                streamed = meta["kind"] == "stream"
                counts = parse_stream(raw) if streamed else parse_reply(raw, meta.get("encoding"))
                if counts.error is not None:
                    self.error(counts.error, num)
                else:
                    lines = await self._lines(path, parsed, prompts, meta["arrival_s"], counts, streamed)
                    if lines:
                        await self._my_turn(seq)
                        for line in lines:
                            self.record(*line)
        except asyncio.CancelledError:
            self.skip(STOPPED, num)
            raise
        except Exception as e:  # the capture never stops for one request: counted, with what went wrong
            self.skip(f"internal error ({type(e).__name__}: {e})", num)
        finally:
            self._end_turn(seq)

    async def _lines(self, path: str, body: dict[str, Any], prompts: list[dict[str, Any]], arrival_s: float,
                     counts: ReplyCounts, streamed: bool) -> list[tuple[float, list[int], int, int, str]]:
        """The lines (record's arguments) of a request whose reply was counted; [] when it is skipped (counted)."""
        num = len(prompts)
        n = body.get("n", 1) if type(body.get("n", 1)) is int else 1
        usage = counts.usage or {}
        ids_list: list[list[int]] = []
        for p in prompts:
            try:
                ids_list.append(await self._token_source.prompt_token_ids(path, p))
            except KvtraceError as e:
                self.skip(f"no token ids: {e}", num)
                return []
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
                self.skip(f"no token ids: {type(e).__name__}", num)
                return []
        req_type = request_type(path, body)
        if num == 1:
            inp = _count(usage.get("prompt_tokens"))
            out = _count(usage.get("completion_tokens"))
            if out is None and counts.counted:
                out = sum(counts.counted.values())
            if out is None:
                self.skip("reply without usage (output length unknown)")
                return []
            return [(arrival_s, ids_list[0], inp if inp is not None else len(ids_list[0]), out, req_type)]
        if not streamed:
            self.skip("batched prompts in a reply without per-prompt counts (send stream: true)", num)
            return []
        # vLLM numbers the choices of prompt i from i * n
        return [(arrival_s, ids, len(ids), sum(counts.counted[i * n + j] for j in range(max(n, 1))), req_type)
                for i, ids in enumerate(ids_list)]


# ---- the process ------------------------------------------------------------------------------------------


async def serve(in_fd: int, out_fd: int) -> int:
    """Read the forwarder's frames from IN_FD and answer on OUT_FD (handoff.py) until the input ends; the exit
    code (0, or a refused configuration's)."""
    from tongyi_trace.capture.tokenize import make_token_source

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_READ_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_fd, "rb", 0))
    answers = os.fdopen(out_fd, "wb", 0)  # a few short lines: written blocking, off the forwarder's loop
    first = await read_frame(reader)
    if first is None or first[0].get("k") != "config":
        return 1
    cfg, salt, _ = first
    writer: LineWriter | None = None
    tok_session: aiohttp.ClientSession | None = None
    try:
        writer = LineWriter(Path(cfg["out_path"]), overwrite=cfg["overwrite"])
        tok_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120.0, sock_connect=30.0),
                                            cookie_jar=aiohttp.DummyCookieJar())
        source = make_token_source(cfg["upstream_url"], tok_session,
                                   Path(cfg["tokenizer_file"]) if cfg["tokenizer_file"] else None)
    except KvtraceError as e:
        if tok_session is not None:
            await tok_session.close()
        if writer is not None:
            writer.close()
            Path(cfg["out_path"]).unlink(missing_ok=True)
        answers.write(orjson.dumps({"error": str(e), "exit_code": e.exit_code}) + b"\n")
        return e.exit_code
    rec = Recorder(writer, cfg["block_size_tokens"], salt, cfg["shared_ids"], source)
    answers.write(b'{"ready": true}\n')
    tasks: dict[int, asyncio.Task[None]] = {}  # by hand-off number
    drain_s: float | None = None  # the forwarder gone without its "end": finish all, the client timeout bounds each
    seq = 0
    try:
        while (got := await read_frame(reader)) is not None:
            meta, body, raw = got
            if meta["k"] == "req":
                task = asyncio.create_task(rec.finished(seq, meta, body, raw))
                tasks[seq] = task
                task.add_done_callback(functools.partial(_forget, tasks, seq))
                seq += 1
            elif meta["k"] == "stopped":
                rec.skip(STOPPED, request_prompts(meta["path"], body)[2])
            elif meta["k"] == "end":
                drain_s = float(meta["drain_s"])
                break
        if tasks:
            _, pending = await asyncio.wait(set(tasks.values()), timeout=drain_s)
            # past the drain: cut what still waits for its token ids; the lines that only wait for their turn
            # are written as the ones before them end
            waiting = rec.waiting
            for n, task in list(tasks.items()):
                if task in pending and n not in waiting:
                    task.cancel()
            if pending:
                await asyncio.wait(pending)
    finally:
        await tok_session.close()
        writer.close()
    with contextlib.suppress(BrokenPipeError):
        answers.write(counts_json(rec.counts))
    return 0


RECORDER_NICE = 10  # the recorder's niceness above the forwarder's (its share of a contended CPU: about a tenth)


def _forget(tasks: dict[int, asyncio.Task[None]], seq: int, _: asyncio.Task[None]) -> None:
    tasks.pop(seq, None)


def main(argv: list[str]) -> int:
    """The recorder process: `python -m tongyi_trace.capture.recorder IN_FD OUT_FD` (started by handoff.py)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the forwarder stops it, through the pipe
        signal.signal(sig, signal.SIG_IGN)
    in_fd, out_fd = int(argv[1]), int(argv[2])
    with contextlib.suppress(OSError):  # yield the CPU to the forwarder: a request's TTFT waits on it, not on us
        os.nice(RECORDER_NICE)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(serve(in_fd, out_fd))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

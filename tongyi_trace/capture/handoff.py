"""The hand-off between `kvtrace capture`'s forwarding process and its recorder process (capture/recorder.py).

The forwarder does nothing on its event loop but forward: for each finished API request it writes one frame
(a few microseconds: one non-blocking pipe write, buffered by the event loop if the pipe is full, never
dropped) holding what the recorder needs: the path, the request's body bytes, the arrival time, the reply's
status, kind and bytes, its content encoding and the forwarding error if any. The recorder, a child process
(`python -m tongyi_trace.capture.recorder IN_FD OUT_FD`), parses them, gets the token ids, hashes, links and
writes the line, so that none of that work delays a request arriving meanwhile (it did, on one event loop: the
forwarder's TTFT p99 then carried the recording's milliseconds).

Frames, in order on the forwarder -> recorder pipe: a 20-byte header (meta, body and reply lengths: <IQQ),
then the meta (a JSON object: "k" its kind), the body bytes and the reply bytes. Kinds: "config" (first: the
capture's options; the body is the hashing key, which thus never reaches a command line or a file), "req" (a
finished request), "stopped" (a request cut at the stop: counted as skipped), "end" (the stop: drain for
meta["drain_s"] seconds, close the file, answer the counts). The recorder answers on its own pipe with JSON
lines: {"ready": true} or {"error": MESSAGE, "exit_code": N} after the config, {"counts": {...}} at the end.
The recorder ignores SIGINT, SIGTERM and SIGHUP and runs in its own session (a Ctrl-C in the terminal reaches
only the forwarder, which stops it through the pipe): it ends when its input ends, after the drain ("end"),
or, the forwarder killed outright, once it wrote all it was handed: even then the file is complete.
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from tongyi_trace.errors import KvtraceError

HEADER = struct.Struct("<IQQ")
RECORDER_MODULE = "tongyi_trace.capture.recorder"
_PIPE_BYTES = 1 << 20  # the hand-off pipe's capacity asked of Linux (its default 64 KiB holds a few requests)
_ANSWER_LIMIT = 1 << 24


@dataclass
class RecorderCounts:
    """What the recorder did with the requests it was handed (merged into the capture's summary)."""

    num_recorded: int = 0
    num_errors: int = 0
    num_skipped: int = 0
    num_distinct_blocks: int = 0
    num_input_length_mismatch: int = 0  # recorded, but usage.prompt_tokens != the token ids' count
    errors: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


class RecorderStartError(KvtraceError):
    """The recorder process refused the capture's options (a bad --tokenizer, an existing -o ...)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def frame(meta: dict[str, Any], body: bytes = b"", reply: bytes = b"") -> list[bytes]:
    """One frame's parts (module doc)."""
    m = orjson.dumps(meta)
    return [HEADER.pack(len(m), len(body), len(reply)), m, body, reply]


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes, bytes] | None:
    """The next frame from READER: (meta, body, reply); None when the input ended (a frame cut short too)."""
    try:
        head = await reader.readexactly(HEADER.size)
        len_meta, len_body, len_reply = HEADER.unpack(head)
        meta = orjson.loads(await reader.readexactly(len_meta))
        body = await reader.readexactly(len_body) if len_body else b""
        reply = await reader.readexactly(len_reply) if len_reply else b""
    except asyncio.IncompleteReadError:
        return None
    return meta, body, reply


def _widen(fd: int) -> None:
    """Ask Linux for a larger pipe buffer on FD (nothing elsewhere; a refusal changes nothing)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    except (ImportError, OSError):
        pass


class RecorderProcess:
    """The forwarder's end: starts the recorder, hands it frames, stops it and returns its counts."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._answers: asyncio.StreamReader | None = None
        self.lost: str | None = None  # why the recorder can no longer be reached, once it cannot
        self.num_handed = 0  # requests handed ("req" and "stopped" frames)

    async def start(self, config: dict[str, Any], salt: bytes) -> None:
        """Start the recorder with CONFIG (recorder.py's options) and SALT; RecorderStartError when it refuses."""
        loop = asyncio.get_running_loop()
        to_rec, from_main = os.pipe()
        from_rec, to_main = os.pipe()
        _widen(from_main)
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", RECORDER_MODULE, str(to_rec), str(to_main)],
                                          pass_fds=(to_rec, to_main), stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        finally:
            os.close(to_rec)
            os.close(to_main)
        self._transport, _ = await loop.connect_write_pipe(lambda: _WriteProtocol(self), os.fdopen(from_main, "wb", 0))
        self._answers = asyncio.StreamReader(limit=_ANSWER_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self._answers),  # type: ignore[arg-type]
                                     os.fdopen(from_rec, "rb", 0))
        self._send(frame({"k": "config", **config}, salt))
        answer = await self._answer()
        if "error" in answer:
            await self.wait_exit()
            raise RecorderStartError(str(answer["error"]), int(answer.get("exit_code", 1)))

    def _send(self, parts: list[bytes]) -> bool:
        if self._transport is None or self._transport.is_closing():
            return False
        self._transport.writelines(parts)
        return True

    def hand(self, meta: dict[str, Any], body: bytes = b"", reply: bytes = b"") -> bool:
        """Hand one request's frame to the recorder; False when it cannot be reached (then `lost` says why)."""
        if self._send(frame(meta, body, reply)):
            self.num_handed += 1
            return True
        if self.lost is None:
            self.lost = "the recorder process ended"
        return False

    async def _answer(self) -> dict[str, Any]:
        assert self._answers is not None
        line = await self._answers.readline()
        if not line:
            code = self._proc.poll() if self._proc is not None else None
            self.lost = f"the recorder process ended (exit code {code})"
            return {"error": f"kvtrace capture: {self.lost}; see its message above", "exit_code": 1}
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    async def stop(self, drain_s: float) -> RecorderCounts | None:
        """Tell the recorder to finish what it was handed within DRAIN_S, close the file and answer its counts;
        None when it ended without them (`lost` says so)."""
        self._send(frame({"k": "end", "drain_s": drain_s}))
        if self._transport is not None:
            self._transport.close()  # what is buffered is still written, then the recorder's input ends
        answer = await self._answer()
        await self.wait_exit()
        if "counts" not in answer:
            return None
        return RecorderCounts(**answer["counts"])

    async def wait_exit(self) -> None:
        """Wait for the recorder process to end (it ends once its input ends and its drain is over)."""
        if self._transport is not None:
            self._transport.close()
        if self._proc is not None:
            await asyncio.to_thread(self._proc.wait)


class _WriteProtocol(asyncio.Protocol):
    """The hand-off pipe's protocol: notes a recorder that went away."""

    def __init__(self, owner: RecorderProcess) -> None:
        self._owner = owner

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self._owner.lost is None:
            self._owner.lost = f"the recorder process ended ({type(exc).__name__})"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a tenth less CPU per forwarded request than asyncio's:
    docs/capture.md#overhead), else asyncio's (both processes of a capture run on it)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def counts_json(counts: RecorderCounts) -> bytes:
    """The recorder's answer at the end (one JSON line)."""
    return orjson.dumps({"counts": asdict(counts)}) + b"\n"

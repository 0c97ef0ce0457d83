"""Shared machinery of the synthetic trace generators: from sessions to Bailian requests and block ids.

Every generator (the `to-c` / `to-b` profiles in synth.py, `--like` in synth_like.py) first draws a
table of requests grouped by session in turn order (`SessionRequests`: arrival in integer ms, type,
user, system prompt, NEW input tokens of the turn, output tokens). `assemble` turns it into the
Qwen-Bailian form the paper's traces use (paper-notes, "The traces"):

- a session is one token stream: system prompt, then (new input, output) of each turn in order;
  turn k's input is the stream up to and including its new input, so a child carries its parent's
  whole input, then the parent's output and its own new input;
- `hash_ids` are per-block CONTENT ids (16-token blocks, not prefix-chained): a block that lies wholly
  inside the system prompt has the prompt's id for that position (shared by every session using the
  prompt), one wholly inside the session's stream has the session's id for that position (so a child
  repeats its parent's full blocks), and the last partial block (input not a multiple of 16) has an id
  of its own (its content differs from the longer block that replaces it in the child);
- ids are finally renumbered 0, 1, 2... in order of first appearance (as the public files do), requests
  are sorted by arrival, and `chat_id` is the arrival index.

`write_jsonl` writes the lines byte-for-byte deterministically (plain, .gz with a zero mtime, or .zst);
`write_mooncake_jsonl` the same in the Mooncake format (the twin of a 512-token-block run).
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt
from numba import njit

from tongyi_trace.errors import UsageError

BLOCK_SIZE_TOKENS = 16
CHUNK_REFS = 1 << 24  # assemble's block references per chunk
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SessionRequests:
    """Requests grouped by session (sessions contiguous, turns 1..T in order); one array entry a request.

    `sys_id` is -1 when the session has no shared system prompt; `user` is -1 when the trace has no
    users. `sys_tokens_by_id[s]` is the length of system prompt s. `redo_kind` marks a request the user
    then redid (the next row is the same turn again, and only that one continues the conversation):
    REGENERATE (the same input, hence the same blocks) or EDIT (the same history, another new input);
    None = no redos. `kept_output_tokens` is the part of each output carried into the next turn's
    context (a reasoning model's answer without its reasoning); None = the whole output."""

    session: I64
    turn: I64
    arrival_ms: I64
    type_code: I64
    user: I64
    sys_id: I64
    new_tokens: I64
    output_tokens: I64
    type_names: tuple[str, ...]
    sys_tokens_by_id: I64
    redo_kind: I64 | None = None
    kept_output_tokens: I64 | None = None


MAIN, REGENERATE, EDIT = 0, 1, 2  # redo_kind values


@dataclass(frozen=True)
class SynthTrace:
    """A finished trace in arrival order; `hash_ids[offsets[i]:offsets[i+1]]` are request i's blocks."""

    chat_id: I64
    parent_chat_id: I64
    arrival_ms: I64
    input_tokens: I64
    output_tokens: I64
    type_code: I64
    turn: I64
    user: I64
    hash_ids: I64
    offsets: I64
    type_names: tuple[str, ...]

    @property
    def num_requests(self) -> int:
        """Number of requests."""
        return int(self.chat_id.size)

    @property
    def num_block_refs(self) -> int:
        """Number of block references (sum of len(hash_ids))."""
        return int(self.hash_ids.size)


def group_starts(session: I64) -> I64:
    """Index of the first request of each request's session (sessions are contiguous)."""
    n = session.size
    new = np.ones(n, dtype=bool)
    new[1:] = session[1:] != session[:-1]
    first = np.flatnonzero(new)
    return np.repeat(first, np.diff(np.append(first, n))).astype(np.int64)


def system_prompt_tokens(sr: SessionRequests) -> I64:
    """Tokens of each request's shared system prompt (0 without one)."""
    padded = np.append(sr.sys_tokens_by_id.astype(np.int64), 0)  # sys_id -1 picks the trailing 0
    return padded[sr.sys_id]


def redo_kinds(sr: SessionRequests) -> I64:
    """SR's redo_kind, MAIN where a redone request is not followed by its redo (cut off by the end)."""
    n = sr.session.size
    if sr.redo_kind is None:
        return np.zeros(n, dtype=np.int64)
    nxt = np.minimum(np.arange(n) + 1, n - 1)
    redone = (np.arange(n) + 1 < n) & (sr.session[nxt] == sr.session) & (sr.turn[nxt] == sr.turn)
    return np.where(redone, sr.redo_kind, MAIN).astype(np.int64)


def input_tokens_of(sr: SessionRequests) -> I64:
    """Input tokens of each request: system prompt + earlier kept turns' new input and kept output +
    its new input (a redone request adds nothing to its session's stream)."""
    kind = redo_kinds(sr)
    kept = sr.kept_output_tokens if sr.kept_output_tokens is not None else sr.output_tokens
    start = group_starts(sr.session)
    step = np.where(kind == MAIN, sr.new_tokens + kept, 0)
    cs = np.cumsum(step) - step
    return (cs - cs[start] + system_prompt_tokens(sr) + sr.new_tokens).astype(np.int64)


@njit(cache=True, nogil=True)
def _number_by_first_use(ids: np.ndarray, number_of: np.ndarray, out: np.ndarray, num: int) -> int:
    """OUT[i] = the number of IDS[i], ids not seen before (NUMBER_OF[id] < 0) numbered NUM, NUM + 1, ... in
    order; the next number."""
    for i in range(ids.shape[0]):
        k = ids[i]
        v = number_of[k]
        if v < 0:
            v = num
            number_of[k] = v
            num += 1
        out[i] = v
    return num


def assemble(sr: SessionRequests, block_size: int = BLOCK_SIZE_TOKENS) -> SynthTrace:
    """Input lengths, content block ids, chat ids and parents of SR, sorted by arrival (see module doc).

    A redone request (redo_kind != MAIN) adds nothing to its session's stream; a REGENERATE has the
    blocks of the next row (the same input), an EDIT shares only the full blocks of the history before
    its new input; both have the parent of the request they were redone as."""
    n = sr.session.size
    idx = np.arange(n, dtype=np.int64)
    kind = redo_kinds(sr)
    main = kind == MAIN
    sys_tok = system_prompt_tokens(sr)
    input_tokens = input_tokens_of(sr)
    before = input_tokens - sr.new_tokens
    num_blocks = -(-input_tokens // block_size)
    full = input_tokens // block_size
    stream_full = np.where(kind == EDIT, before // block_size, full)  # blocks equal to the session's
    sys_full = sys_tok // block_size
    next_main = np.minimum.accumulate(np.where(main, idx, n - 1)[::-1])[::-1]
    src = np.where(kind == REGENERATE, next_main, idx)  # whose blocks a request has

    # id spaces: [system prompt blocks][session stream blocks][a request's own blocks, by (request, pos)]
    sys_full_by_id = sr.sys_tokens_by_id // block_size
    sys_base = np.concatenate([[0], np.cumsum(sys_full_by_id)]).astype(np.int64)
    num_sys_ids = int(sys_base[-1])
    sess_codes, sess_idx = np.unique(sr.session, return_inverse=True)
    sess_idx = sess_idx.reshape(-1)
    sess_span = np.zeros(sess_codes.size, dtype=np.int64)
    np.maximum.at(sess_span, sess_idx, full)
    sess_base = num_sys_ids + np.concatenate([[0], np.cumsum(sess_span)[:-1]]).astype(np.int64)
    own_base = num_sys_ids + int(sess_span.sum()) + np.concatenate([[0], np.cumsum(num_blocks)[:-1]])

    # arrival order (stable: ties keep session/turn order; a child is always strictly later)
    order = np.lexsort((idx, sr.arrival_ms))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = idx

    nb_sorted = num_blocks[order]
    offsets = np.concatenate([[0], np.cumsum(nb_sorted)]).astype(np.int64)
    total = int(offsets[-1])
    sys_start = sys_base[np.maximum(sr.sys_id, 0)]
    sess_start = sess_base[sess_idx]

    # each reference's id in the id spaces, then renumbered 0.. by first appearance; in chunks of
    # requests in arrival order (a 100x trace has 6e8 references: only the result is trace-sized)
    space = int(own_base[-1] + num_blocks[-1]) if n else 0
    number_of = np.full(space, -1, dtype=np.int32 if space < 2**31 else np.int64)
    hash_ids = np.empty(total, dtype=np.int64)
    num = 0
    ends = np.unique(np.append(np.searchsorted(offsets, np.arange(CHUNK_REFS, total, CHUNK_REFS)), n))
    lo = 0
    for hi in ends.tolist():
        a, b = int(offsets[lo]), int(offsets[hi])
        ref_req = src[np.repeat(order[lo:hi], nb_sorted[lo:hi])]  # whose blocks each ref is
        pos = np.arange(b - a, dtype=np.int64) - np.repeat(offsets[lo:hi] - a, nb_sorted[lo:hi])
        ids = own_base[ref_req] + pos
        in_stream = pos < stream_full[ref_req]
        ids[in_stream] = sess_start[ref_req[in_stream]] + pos[in_stream]
        in_sys = pos < sys_full[ref_req]
        ids[in_sys] = sys_start[ref_req[in_sys]] + pos[in_sys]
        num = _number_by_first_use(ids, number_of, hash_ids[a:b], num)
        lo = hi
    del number_of

    # parent: the last kept (MAIN) request of the session before this one
    last_main = np.maximum.accumulate(np.where(main, idx, -1))
    prev_main = np.concatenate([[-1], last_main[:-1]])
    parent_orig = np.where(sr.turn > 1, prev_main, -1)
    parent_chat = np.where(parent_orig >= 0, rank[np.maximum(parent_orig, 0)], -1)
    return SynthTrace(
        chat_id=np.arange(n, dtype=np.int64),
        parent_chat_id=parent_chat[order].astype(np.int64),
        arrival_ms=sr.arrival_ms[order],
        input_tokens=input_tokens[order],
        output_tokens=sr.output_tokens[order],
        type_code=sr.type_code[order],
        turn=sr.turn[order],
        user=sr.user[order],
        hash_ids=hash_ids,
        offsets=offsets,
        type_names=sr.type_names,
    )


@contextmanager
def open_output(path: Path) -> Iterator[IO[str]]:
    """Open PATH for text writing, compressed by suffix (.gz, .zst), reproducibly (no timestamps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as raw:
            if path.suffix == ".gz":
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz, \
                        io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as f:
                    yield f
            elif path.suffix == ".zst":
                import zstandard

                with zstandard.ZstdCompressor(level=3).stream_writer(raw) as zw, \
                        io.TextIOWrapper(zw, encoding="utf-8", newline="\n") as f:
                    yield f
            else:
                with io.TextIOWrapper(raw, encoding="utf-8", newline="\n") as f:
                    yield f
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write the trace ({e.strerror}); check the output path") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _id_text_offsets(ids: I64) -> I64:
    """Character offset of each id in ", ".join(map(str, ids)) (plus the end offset, + 2)."""
    digits = np.ones(ids.size, dtype=np.int64)
    for k in range(1, 19):
        digits += ids >= 10**k
    return np.concatenate([[0], np.cumsum(digits + 2)]).astype(np.int64)


def iter_lines(trace: SynthTrace, with_users: bool, chunk_requests: int = 4096) -> Iterator[str]:
    """The Bailian JSONL lines of TRACE (keys in the public files' order, then user_id).

    Requests go in chunks: a chunk's ids are joined into one string once and each line slices its
    part, which keeps memory bounded by the chunk (not the 6 M-id trace) and the join fast."""
    names = [json.dumps(t) for t in trace.type_names]
    for lo in range(0, trace.num_requests, chunk_requests):
        hi = min(lo + chunk_requests, trace.num_requests)
        a, b = int(trace.offsets[lo]), int(trace.offsets[hi])
        ids = trace.hash_ids[a:b]
        all_ids = ", ".join(map(str, ids.tolist()))
        char_at = _id_text_offsets(ids)[trace.offsets[lo:hi + 1] - a].tolist()
        cols = zip(trace.chat_id[lo:hi].tolist(), trace.parent_chat_id[lo:hi].tolist(),
                   trace.arrival_ms[lo:hi].tolist(), trace.input_tokens[lo:hi].tolist(),
                   trace.output_tokens[lo:hi].tolist(), trace.type_code[lo:hi].tolist(),
                   trace.turn[lo:hi].tolist(), trace.user[lo:hi].tolist(), strict=True)
        for i, (cid, par, ms, inp, out, tc, turn, user) in enumerate(cols):
            blocks = all_ids[char_at[i]:max(char_at[i], char_at[i + 1] - 2)]
            line = (f'{{"chat_id": {cid}, "parent_chat_id": {par}, '
                    f'"timestamp": {ms // 1000}.{ms % 1000:03d}, "input_length": {inp}, '
                    f'"output_length": {out}, "type": {names[tc]}, "turn": {turn}, "hash_ids": [{blocks}]')
            yield line + (f', "user_id": "u{user}"}}\n' if with_users and user >= 0 else "}\n")


def write_mooncake_jsonl(trace: SynthTrace, path: Path) -> None:
    """Write TRACE as Mooncake JSONL (timestamp in ms, lengths, hash_ids: 512-token blocks) to PATH."""
    with open_output(path) as f:
        for lo in range(0, trace.num_requests, 4096):
            hi = min(lo + 4096, trace.num_requests)
            ids = trace.hash_ids[int(trace.offsets[lo]):int(trace.offsets[hi])].tolist()
            base = int(trace.offsets[lo])
            f.write("".join(
                f'{{"timestamp": {ms}, "input_length": {inp}, "output_length": {out}, "hash_ids": '
                f'[{", ".join(map(str, ids[a - base:b - base]))}]}}\n'
                for ms, inp, out, a, b in zip(trace.arrival_ms[lo:hi].tolist(), trace.input_tokens[lo:hi].tolist(),
                                              trace.output_tokens[lo:hi].tolist(), trace.offsets[lo:hi].tolist(),
                                              trace.offsets[lo + 1:hi + 1].tolist(), strict=True)))


def write_jsonl(trace: SynthTrace, path: Path, with_users: bool = True) -> None:
    """Write TRACE as Qwen-Bailian JSONL to PATH (compressed by suffix), atomically."""
    with open_output(path) as f:
        batch: list[str] = []
        for line in iter_lines(trace, with_users):
            batch.append(line)
            if len(batch) >= 4096:
                f.write("".join(batch))
                batch.clear()
        f.write("".join(batch))

"""Sessions for traces that have none: which earlier request each request continues (its parent turn).

A chat turn sends the whole conversation so far: the parent's prompt, then the parent's answer, then the
new message. In block hashes (the public traces' turn structure) the child therefore starts with every
FULL block of the parent's prompt; the parent's last, partial block differs (the answer's first tokens
fill what was padding) and the answer's blocks follow. A shared system prompt also makes two prompts
start alike, so the rule keys on the parent's WHOLE prompt, never on a prefix of it:

    key(R)   = the chained id of R's last full block (R's full blocks: min(input // block_size, #hash_ids))
    offer    R offers key(R) when it has a full block; the offer registers R as the key's latest owner
             unless key(R) is a bare shared prefix: an earlier request had already gone PAST that block
             (had a block after it) while no earlier request had offered it. A request whose whole full
             prompt is a system prompt that others extend is not a conversation of its own.
    link(Q)  for Q's chained ids from the deepest to the first, the first that has an owner P (the latest
             registered before Q) with input_tokens(P) < input_tokens(Q) (a continuation adds the answer
             and a message): P is Q's parent. None: Q is a root.
    turn     1 for a root, the parent's turn + 1; session = the arrival index of the chain's root.

So the longest matching earlier prompt wins, the most recent among equal prompts (a re-asked first turn
that is then continued), and only earlier requests are candidates (a parent that arrives after is not
taken). Each request costs one dictionary look-up per block: linear in the trace's block references.

Measured (bench/bench_sessions.py): on `kvtrace synth --profile to-c --seed 1` with chat_id,
parent_chat_id and turn ignored, 99.90% of requests get their true parent (roots included). Each rule
earns its place: without the length rule 97.86% (roots that merely start with an earlier short prompt get
it as a parent); without the bare-prefix rule 99.61% on to-C, and on ../shared/traces/
mooncake_conversation.jsonl, where every prompt starts with the same 512-token block, all but 733 of its
12,031 requests would hang off the short prompts that are that block alone (594 parents with 5+ children).
With both: 3,889 follow-up turns in 8,142 sessions there, almost every parent continued once. Requiring
the child to hold the parent's answer too (input >= parent's input + output) gains 0.02 points on to-C
but drops 245 Mooncake follow-ups whose prompts hold less than the recorded output, and needs every
earlier request's output, which the shared API (`SessionLinker.link(hash_ids, input_tokens)`) does not take.

`SessionLinker` is the online form (one request at a time, in arrival order: `kvtrace capture`);
`link_sessions` the batch form over a whole trace's chained ids (`kvtrace ingest`), numpy-vectorised and
held to the online form by tests/trace/test_sessions.py. Standard library and numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tongyi_trace.errors import UsageError
from tongyi_trace.splitmix import CHAIN_SEED, mix64

_CHAIN_SEED = int(CHAIN_SEED)


@dataclass(frozen=True, slots=True)
class SessionLink:
    """Where one request sits in its conversation."""

    parent: int   # arrival index (0-based) of the request this one continues; -1 for a root
    turn: int     # 1 for a root, parent's turn + 1 otherwise
    session: int  # arrival index of the session's root request


@dataclass(frozen=True, slots=True)
class SessionLinks:
    """The links of a whole trace, one entry per request in arrival order (`link_sessions`)."""

    parent: npt.NDArray[np.int64]   # arrival index of the parent, -1 for a root
    turn: npt.NDArray[np.int64]     # 1 for a root
    session: npt.NDArray[np.int64]  # arrival index of the root

    def __len__(self) -> int:
        return int(self.parent.shape[0])

    def __getitem__(self, i: int) -> SessionLink:
        return SessionLink(int(self.parent[i]), int(self.turn[i]), int(self.session[i]))


def _check_block_size(block_size_tokens: int) -> None:
    if isinstance(block_size_tokens, bool) or not isinstance(block_size_tokens, int | np.integer) \
            or block_size_tokens < 1:
        raise UsageError(f"block size must be a positive number of tokens, got {block_size_tokens!r}")


def chain_prefix(hash_ids: Sequence[int]) -> list[int]:
    """The prefix-chained ids (unsigned 64-bit python ints) of one request's block ids: the same values as
    trace/chain.py's `chain_ids` (viewed as unsigned), computed without numba."""
    out = []
    h = _CHAIN_SEED
    for b in hash_ids:
        h = mix64(h ^ mix64(int(b)))  # int(): numpy integers would overflow in mix64's arithmetic
        out.append(h)
    return out


class SessionLinker:
    """Online session inference: requests are fed in arrival order; a request continues an earlier one
    when its block hashes start with ALL of that request's full (not partial) prompt blocks and it is
    longer in tokens; the deepest such prompt wins, the most recent among equal ones. A request whose full
    prompt is only a prefix that an earlier request had already extended (a shared system prompt) is
    never a parent. The rule and its measured accuracy: this module's docstring.

    State: a dict from a chained whole-prompt id to its latest request, the set of chained ids that had a
    block after them, and each request's input length, turn and session (O(1) work per block)."""

    def __init__(self, block_size_tokens: int) -> None:
        _check_block_size(block_size_tokens)
        self.block_size_tokens = int(block_size_tokens)
        self._owner: dict[int, int] = {}
        self._inner: set[int] = set()
        self._input: list[int] = []
        self._turn: list[int] = []
        self._session: list[int] = []

    @property
    def num_requests(self) -> int:
        """Requests linked so far."""
        return len(self._input)

    def link(self, hash_ids: Sequence[int], input_tokens: int) -> SessionLink:
        """Links the next request (its arrival index is the number of earlier calls)."""
        if input_tokens < 0:
            raise UsageError(f"input_tokens must be >= 0, got {input_tokens}")
        chain = chain_prefix(hash_ids)
        i = len(self._input)
        parent = -1
        for c in reversed(chain):
            j = self._owner.get(c)
            if j is not None and self._input[j] < input_tokens:
                parent = j
                break
        num_full = min(input_tokens // self.block_size_tokens, len(chain))
        if num_full:
            key = chain[num_full - 1]
            if key in self._owner or key not in self._inner:
                self._owner[key] = i
        self._inner.update(chain[:-1])
        turn = 1 if parent < 0 else self._turn[parent] + 1
        session = i if parent < 0 else self._session[parent]
        self._input.append(int(input_tokens))
        self._turn.append(turn)
        self._session.append(session)
        return SessionLink(parent, turn, session)


def link_sessions(chain_ids: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64],
                  input_tokens: npt.NDArray[np.int64], block_size_tokens: int) -> SessionLinks:
    """The batch form of `SessionLinker`: the links of N requests in arrival order, given their
    prefix-chained block ids (trace/chain.py's `chain_ids`, flat, split at OFFSETS of length N+1) and
    input lengths. Gives exactly the links of feeding SessionLinker one request at a time."""
    _check_block_size(block_size_tokens)
    offsets = np.asarray(offsets, dtype=np.int64)
    chain = np.asarray(chain_ids, dtype=np.int64)
    inp = np.asarray(input_tokens, dtype=np.int64)
    n = int(offsets.shape[0]) - 1
    if n < 0 or inp.shape[0] != n or chain.shape[0] != int(offsets[-1]):
        raise UsageError("link_sessions: offsets must have one entry per request plus one, ending at "
                         "len(chain_ids), and input_tokens one per request")
    parent = np.full(n, -1, dtype=np.int64)
    num_blocks = np.diff(offsets)
    num_full = np.minimum(inp // block_size_tokens, num_blocks)
    offer_req = np.flatnonzero(num_full > 0)
    if offer_req.size:
        offer_key = chain[offsets[offer_req] + num_full[offer_req] - 1]
        keys, first = np.unique(offer_key, return_index=True)  # first offer of each key (offers in arrival order)
        first_offer = offer_req[first]
        at, hd = _key_blocks(keys, chain)  # the blocks whose chained id is some request's whole-prompt key
        hq = np.searchsorted(offsets, at, side="right") - 1  # their requests
        # the first request that had a block after each key ("went past" it); n when none did
        inner = at != offsets[hq + 1] - 1
        first_inner = np.full(keys.shape[0], n, dtype=np.int64)
        hit_d, hit_first = np.unique(hd[inner], return_index=True)  # requests ascend along the flat array
        first_inner[hit_d] = hq[inner][hit_first]
        registrable = first_inner >= first_offer  # else: a bare shared prefix, never registered
        # registered offers, as (key number, request) packed in one sortable int64
        offer_d = np.searchsorted(keys, offer_key)
        ok = registrable[offer_d]
        packed = np.sort(offer_d[ok] * n + offer_req[ok])
        # every block whose chained id is a registered key: the key's latest owner before the block's request
        reg = registrable[hd]
        hq, hd = hq[reg], hd[reg]
        k = np.searchsorted(packed, hd * n + hq, side="left") - 1  # the last offer strictly before hq
        found = packed[np.maximum(k, 0)]
        valid = (k >= 0) & (found // n == hd)
        owner = found % n
        valid &= inp[owner] < inp[hq]
        vq, vj = hq[valid], owner[valid]
        if vq.size:  # the deepest valid block of each request: the last one along the flat array
            last = np.append(vq[1:] != vq[:-1], True)
            parent[vq[last]] = vj[last]
    turn = np.ones(n, dtype=np.int64)
    session = np.arange(n, dtype=np.int64)
    for i in np.flatnonzero(parent >= 0).tolist():  # parents come first: one pass in arrival order
        p = int(parent[i])
        turn[i] = turn[p] + 1
        session[i] = session[p]
    return SessionLinks(parent, turn, session)


_LOOKUP_SLICE = 1 << 20  # blocks looked up at once: bounded temporaries on traces of many millions of blocks


def _key_blocks(keys: npt.NDArray[np.int64], chain: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64],
                                                                                  npt.NDArray[np.int64]]:
    """The flat positions of CHAIN whose value is one of the sorted unique KEYS (ascending), and which key."""
    at, which = [], []
    for start in range(0, chain.shape[0], _LOOKUP_SLICE):
        part = chain[start:start + _LOOKUP_SLICE]
        pos = np.minimum(np.searchsorted(keys, part), keys.shape[0] - 1)
        hit = np.flatnonzero(keys[pos] == part)
        at.append(hit + start)
        which.append(pos[hit])
    empty = np.zeros(0, dtype=np.int64)
    return (np.concatenate(at).astype(np.int64) if at else empty,
            np.concatenate(which).astype(np.int64) if which else empty)


def parent_indices(chat_id: npt.NDArray[np.int64], parent_chat_id: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each request's parent as an arrival index (-1 for a root or a parent that never appears), from a
    trace's own chat_id / parent_chat_id columns in arrival order: what `SessionLink.parent` means."""
    chat = np.asarray(chat_id, dtype=np.int64)
    par = np.asarray(parent_chat_id, dtype=np.int64)
    if chat.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(chat, kind="stable")
    pos = np.minimum(np.searchsorted(chat[order], par), chat.shape[0] - 1)
    found = (chat[order][pos] == par) & (par != -1)
    return np.where(found, order[pos], -1).astype(np.int64)


def parent_recovery(inferred_parent: npt.NDArray[np.int64], true_parent: npt.NDArray[np.int64]) -> float:
    """Share of requests whose inferred parent is their true parent (arrival indices, -1 = root; roots
    count: a true root must be inferred a root)."""
    inferred = np.asarray(inferred_parent)
    if inferred.shape != np.asarray(true_parent).shape or inferred.size == 0:
        raise UsageError("parent_recovery: give two equally long, non-empty parent arrays")
    return float(np.mean(inferred == np.asarray(true_parent)))

"""Deterministic prompt synthesis: trace block ids -> token ids, identical ids -> identical tokens.

Definition. Token j (0 <= j < trace block size) of block id b is
    low + splitmix64(splitmix64(seed_key + b) + j * GOLDEN) mod (vocab_size - low)
with seed_key = splitmix64(seed) (a different salt for filler tokens). A request's prompt is, in block
order, the first `num_tokens` tokens of each of its blocks (blocks.parquet: block size, or fewer for the
last partial block), followed by request-unique filler tokens when input_length exceeds what its blocks
cover, and is cut to input_length. With `unique_from` (the replay passes the tokens the engine's full prompt
blocks cover, sim/engine_model.py) the tokens from there on are filler too: they fill the engine's partial
last block, which never hits, and then the blocks of generated tokens, which would otherwise hash alike
for two identical requests (greedy decoding) where the simulator gives every output block an id of its
own. Token ids are sent as `"prompt": [ids]`, never text, so no
re-tokenization can drift (the AIPerf / vLLM-bench text pain point, ../shared/reference/peers.md).

Token ids lie in [low, vocab_size): low (default 100) keeps clear of BOS/EOS/pad ids at the bottom; set
vocab_size to the number of ordinary tokens of a real model (e.g. 151643 for Qwen2) so that no special
token at the top of its vocabulary is produced. splitmix64 and GOLDEN: tongyi_trace/splitmix.py.
"""

from __future__ import annotations

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.splitmix import GOLDEN, splitmix64

_FILLER_SALT = np.uint64(0xD1B54A32D192ED03)
DEFAULT_MIN_TOKEN_ID = 100


class PromptSynth:
    """Builds the token-id prompt of a request from its block ids (see the module docstring)."""

    def __init__(self, seed: int, vocab_size: int, trace_block_size: int,
                 min_token_id: int = DEFAULT_MIN_TOKEN_ID) -> None:
        if min_token_id < 0:
            raise UsageError(f"--min-token-id {min_token_id} must be >= 0 (a token id)")
        if vocab_size - min_token_id < 2:
            raise UsageError(f"--vocab-size {vocab_size}: must exceed the lowest token id {min_token_id} "
                             "by at least 2")
        if trace_block_size <= 0:
            raise UsageError(f"trace block size {trace_block_size} must be positive")
        self.seed = seed
        self.vocab_size = vocab_size
        self.min_token_id = min_token_id
        self.trace_block_size = trace_block_size
        seed_arr = np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
        self._key = splitmix64(seed_arr)
        self._filler_key = splitmix64(seed_arr ^ _FILLER_SALT)
        self._offsets = np.arange(trace_block_size, dtype=np.uint64) * GOLDEN
        self._span = np.uint64(vocab_size - min_token_id)

    def block_tokens(self, block_ids: np.ndarray) -> np.ndarray:
        """Token ids of whole blocks: shape (len(block_ids), trace_block_size), int64."""
        ids = np.asarray(block_ids).astype(np.int64).view(np.uint64)
        heads = splitmix64(self._key + ids)
        mixed = splitmix64(heads[:, None] + self._offsets[None, :])
        return (mixed % self._span).astype(np.int64) + self.min_token_id

    def filler_tokens(self, req_idx: int, num_tokens: int) -> np.ndarray:
        """NUM_TOKENS request-unique tokens (used past the last block; never shared between requests)."""
        head = splitmix64(self._filler_key + np.array([req_idx], dtype=np.int64).view(np.uint64))
        mixed = splitmix64(head + np.arange(num_tokens, dtype=np.uint64) * GOLDEN)
        return (mixed % self._span).astype(np.int64) + self.min_token_id

    def prompt(self, req_idx: int, block_ids: np.ndarray, block_num_tokens: np.ndarray,
               input_length: int, unique_from: int | None = None) -> np.ndarray:
        """The prompt of one request: its blocks' tokens (num_tokens each), filler, cut to input_length;
        UNIQUE_FROM: filler from that token on (module doc)."""
        if len(block_ids):
            toks = self.block_tokens(block_ids)
            n = np.clip(np.asarray(block_num_tokens, dtype=np.int64), 0, self.trace_block_size)
            mask = np.arange(self.trace_block_size)[None, :] < n[:, None]
            body = toks[mask]
        else:
            body = np.empty(0, dtype=np.int64)
        if unique_from is not None:
            body = body[:max(int(unique_from), 0)]
        if len(body) < input_length:
            body = np.concatenate([body, self.filler_tokens(req_idx, input_length - len(body))])
        return body[:input_length]

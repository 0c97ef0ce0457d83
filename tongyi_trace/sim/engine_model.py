"""Predict, request by request, the prefix-cache hit a real vLLM engine reports (cached_tokens).

Model of vLLM 0.32's KV-cache manager (checked in vllm/v1/core/: kv_cache_manager.py, block_pool.py,
single_type_kv_cache_manager.py, kv_cache_utils.py), one request at a time in the given order:
- Only FULL engine blocks are hashed and cached; the trace's blocks are regrouped to the engine's block
  size (stream.regroup).
- The prompt is input_tokens long (the replay pads the blocks' tokens with request-unique filler).
- Last-token rule: `get_computed_blocks` caps the hit at `max_cache_hit_length = num_tokens - 1`, so at
  most floor((P - 1) / E) blocks of a P-token prompt hit (a fully cached prompt recomputes its last block).
- Generated tokens fill blocks too: the engine caches floor((P + O - 1) / E) full blocks of a request
  with O output tokens (the last sampled token's KV is never computed); the blocks past the prompt's full
  blocks hold output tokens, never hit (the next prompt continues differently) but take cache space.
  Each has an id of its own: two identical requests generate the same tokens, which vLLM would hash alike,
  so `kvtrace replay` makes a prompt's tokens past its last full block request-unique (the partial block
  never hits either way), and every output block's hash is then unique, as here.
- A request's blocks stay pinned (ref_cnt > 0) until it finishes; `free` releases them in reverse order
  (tail first), cached blocks appended to the free queue (LRU order), uncached ones (the partial last
  block) prepended, i.e. reused first: modelled as one slot held while running and free afterwards.
- `BlockPool` takes block 0 as the null block, so an engine with num_gpu_blocks blocks has
  num_gpu_blocks - 1 usable slots.
Deviations: vLLM does not de-duplicate a block recomputed under the last-token rule (a second copy is
cached while the first stays in the free queue); the model touches the single copy instead. Requests run
one at a time: concurrent requests in the engine pin each other's blocks, which the model does not see.
"""

from __future__ import annotations

import numpy as np

from tongyi_trace.errors import UsageError
from tongyi_trace.policy.file import PolicyParams
from tongyi_trace.run import RunTables
from tongyi_trace.sim.simulate import EngineShape, simulate_policy
from tongyi_trace.sim.stream import Stream, load_stream, regroup


def engine_stream(stream: Stream, engine_block_size: int, output_tokens: np.ndarray | None,
                  prompt_tokens: np.ndarray | None = None) -> tuple[Stream, EngineShape]:
    """STREAM regrouped to ENGINE_BLOCK_SIZE with never-hit output blocks appended to each request.
    PROMPT_TOKENS: tokens sent per request (default: those its blocks cover; the replay pads a prompt
    with request-unique filler up to input_tokens)."""
    e = int(engine_block_size)
    es = regroup(stream, e)
    n = es.num_requests
    prompt = stream.req_tokens.astype(np.int64)
    if prompt_tokens is not None:
        prompt = np.maximum(prompt, np.asarray(prompt_tokens, np.int64))
    out = np.ones(n, np.int64) if output_tokens is None else np.asarray(output_tokens, np.int64)
    if out.shape != (n,):
        raise UsageError(f"output_tokens has {out.size} values for {n} requests")
    out = np.maximum(out, 1)
    kv_tokens = prompt + out - 1  # tokens whose KV the engine computes
    num_prompt_blocks = np.diff(es.req_off)
    num_out_blocks = np.maximum(kv_tokens // e - num_prompt_blocks, 0)
    extra = (kv_tokens % e > 0).astype(np.int64)
    maxhit = np.maximum(prompt - 1, 0) // e
    lens = num_prompt_blocks + num_out_blocks
    off = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    blk = np.empty(int(off[-1]), np.int64)
    pos = np.arange(blk.size, dtype=np.int64) - np.repeat(off[:-1], lens)
    is_prompt = pos < np.repeat(num_prompt_blocks, lens)
    blk[is_prompt] = es.blk
    blk[~is_prompt] = es.num_ids + np.arange(int((~is_prompt).sum()), dtype=np.int64)
    total_ids = es.num_ids + int((~is_prompt).sum())
    full = Stream(off, blk, np.full(blk.size, e, np.int64), es.req_cat, es.req_time_s, prompt,
                  es.categories, total_ids, e, es.req_idx)
    return full, EngineShape(maxhit, num_prompt_blocks, extra)


def predict_request_hits(tables: RunTables, req_idx: np.ndarray, engine_block_size: int,
                         num_engine_blocks: int | None, policy: str = "lru",
                         params: PolicyParams | None = None,
                         output_tokens: np.ndarray | None = None) -> np.ndarray:
    """Predicted prefix-cache hit TOKENS of each request of REQ_IDX (replayed in that order) on a vLLM
    engine with ENGINE_BLOCK_SIZE-token blocks and NUM_ENGINE_BLOCKS = the engine's num_gpu_blocks
    (None = unlimited cache, the ideal). POLICY is the engine's eviction policy ("lru" = stock vLLM,
    "wa" = the kvtrace plugin, which needs PARAMS); OUTPUT_TOKENS = tokens generated per request
    (None: one token, no output block)."""
    full, shape, capacity = engine_case(tables, req_idx, engine_block_size, num_engine_blocks, params, output_tokens)
    res = simulate_policy(full, policy, capacity, fit=params, engine=shape, timing=False)
    return res.req_hit_tokens


def engine_case(tables: RunTables, req_idx: np.ndarray, engine_block_size: int, num_engine_blocks: int | None,
                params: PolicyParams | None = None, output_tokens: np.ndarray | None = None,
                ) -> tuple[Stream, EngineShape, int]:
    """What the engine serves when the requests REQ_IDX of the run (TABLES) are replayed in that order (the arguments
    of predict_request_hits): the engine stream, its shape and the cache's capacity in engine blocks."""
    sel = np.asarray(req_idx, np.int64)
    stream = load_stream(tables, sel, params.context if params else None)
    input_tokens = tables.requests()["input_tokens"].to_numpy()[sel]
    full, shape = engine_stream(stream, engine_block_size, output_tokens, input_tokens)
    if num_engine_blocks is None:
        capacity = full.num_ids + int(shape.req_extra.max(initial=0))
    else:
        if num_engine_blocks < 2:
            raise UsageError(f"num_engine_blocks must be >= 2 (one is vLLM's null block), got {num_engine_blocks}")
        capacity = int(num_engine_blocks) - 1
    return full, shape, capacity


def engine_block_ids(tables: RunTables, req_idx: np.ndarray, engine_block_size: int,
                     output_tokens: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Per request of REQ_IDX (replayed in that order), the ids of the blocks the engine caches for it in
    the simulator's engine stream (engine_case): what `kvtrace replay` sends as kv_block_keys, so that the
    plugin's guard samples the same blocks as the simulator's; and the prompt tokens those blocks' prompt
    part covers (the replay makes the tokens past it request-unique: see the module doc)."""
    full, shape, _ = engine_case(tables, req_idx, engine_block_size, None, None, output_tokens)
    return np.split(full.blk, full.req_off[1:-1]), shape.req_nstat * int(engine_block_size)

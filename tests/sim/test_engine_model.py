"""The vLLM engine model behind predict_request_hits, on hand-made run folders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tongyi_trace.errors import UsageError
from tongyi_trace.run import open_run
from tongyi_trace.sim.engine_model import engine_stream, predict_request_hits
from tongyi_trace.sim.stream import load_stream, regroup, stream_from_lists

# 16-token trace blocks: A = 4 full blocks (64 tokens), B = A + 8 tokens (72), then A again.
A = [10, 11, 12, 13]
B = [10, 11, 12, 13, 14]
TOK_A = [16] * 4
TOK_B = [16] * 4 + [8]


def test_regroup_up_and_down() -> None:
    s = stream_from_lists([A, B], num_tokens=[TOK_A, TOK_B], block_size=16)
    up = regroup(s, 32)  # pairs of full trace blocks; B's partial 5th block makes no full engine block
    assert np.diff(up.req_off).tolist() == [2, 2] and up.num_ids == 2
    assert up.blk.tolist() == [0, 1, 0, 1]
    down = regroup(s, 8)  # each full block -> 2 sub-blocks, B's 8-token block -> 1
    assert np.diff(down.req_off).tolist() == [8, 9] and down.num_ids == 9
    with pytest.raises(UsageError, match="multiple or a divisor"):
        regroup(s, 24)


def test_engine_shape_follows_vllm() -> None:
    s = stream_from_lists([A, B], num_tokens=[TOK_A, TOK_B], block_size=16)
    full, shape = engine_stream(s, 32, np.array([40, 1]))
    # A: P=64, O=40 -> KV of 103 tokens: 3 full blocks (2 prompt + 1 output), 1 partial slot,
    #    at most floor(63/32) = 1 block may hit (last-token rule).
    # B: P=72, O=1 -> KV of 72 tokens: 2 full prompt blocks, a partial slot; up to floor(71/32) = 2 hit.
    assert np.diff(full.req_off).tolist() == [3, 2]
    assert shape.req_nstat.tolist() == [2, 2]
    assert shape.req_extra.tolist() == [1, 1]
    assert shape.req_maxhit.tolist() == [1, 2]
    assert full.blk[2] == full.num_ids - 1  # the output block is a fresh id


def test_predict_request_hits_last_token_rule(make_run: Callable[..., Path]) -> None:
    run = open_run(make_run([A, B, A], tokens=[TOK_A, TOK_B, TOK_A]))
    hits = predict_request_hits(run.tables(), np.arange(3), 32, None)
    # B hits both of A's engine blocks (64 tokens); A again may hit only 1 block of 2 (63 tokens max).
    assert hits.tolist() == [0, 64, 32]
    # the order given is the replay order: B first, then A (1 block), then A again
    assert predict_request_hits(run.tables(), np.array([1, 0, 0]), 32, None).tolist() == [0, 32, 32]
    # engine block = trace block: A has 4 blocks, B hits all 4, A again 3 (floor(63/16))
    assert predict_request_hits(run.tables(), np.arange(3), 16, None).tolist() == [0, 64, 48]


def test_predict_request_hits_capacity_and_null_block(make_run: Callable[..., Path]) -> None:
    # C shares nothing with A. Engine with 4 blocks = 3 usable (block 0 is vLLM's null block).
    c = [20, 21, 22, 23]
    run = open_run(make_run([A, c, B], tokens=[TOK_A, TOK_A, TOK_B]))
    # A caches a0,a1; C (64 tokens, one partial-free request) needs 2 blocks: 1 free + evict a1 (A's tail,
    # released first); B then hits a0 only.
    assert predict_request_hits(run.tables(), np.arange(3), 32, 4).tolist() == [0, 0, 32]
    # 5 blocks = 4 usable: everything fits, B hits 2 blocks.
    assert predict_request_hits(run.tables(), np.arange(3), 32, 5).tolist() == [0, 0, 64]
    with pytest.raises(UsageError, match="null block"):
        predict_request_hits(run.tables(), np.arange(3), 32, 1)


def test_output_blocks_take_space(make_run: Callable[..., Path]) -> None:
    # 4 usable engine blocks (32 tokens). R1 = D (2 blocks, d0 d1); R2 = A with O output tokens;
    # R3 = D + one more block (96 tokens: up to 2 blocks may hit).
    # O = 33: A's KV covers 64 + 32 tokens = 3 full blocks (a0, a1, one output block): 2 free slots + the
    # eviction of d1 (D's tail) -> R3 hits d0 only. O = 1: A needs 2 blocks, both free -> R3 hits d0, d1.
    d = [30, 31, 32, 33]
    d_longer = [30, 31, 32, 33, 34, 35]
    run = open_run(make_run([d, A, d_longer], tokens=[TOK_A, TOK_A, [16] * 6]))
    with_out = predict_request_hits(run.tables(), np.arange(3), 32, 5, output_tokens=np.array([1, 33, 1]))
    without = predict_request_hits(run.tables(), np.arange(3), 32, 5, output_tokens=np.array([1, 1, 1]))
    assert with_out.tolist() == [0, 0, 32]
    assert without.tolist() == [0, 0, 64]


def test_stream_of_a_run_follows_the_given_order(make_run: Callable[..., Path]) -> None:
    run = open_run(make_run([A, B], tokens=[TOK_A, TOK_B], categories=["x", "y"]))
    s = load_stream(run.tables(), np.array([1, 0]))
    assert s.req_idx.tolist() == [1, 0] and [s.categories[c] for c in s.req_cat] == ["y", "x"]
    assert s.req_tokens.tolist() == [72, 64]

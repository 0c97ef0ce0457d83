"""Prompt synthesis: identical block ids give identical tokens, in range, cut to input_length."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.lanes import examples
from tongyi_trace.errors import UsageError
from tongyi_trace.replay.prompts import PromptSynth


@settings(max_examples=examples(60), deadline=None)
@given(ids=st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=12),
       seed=st.integers(0, 2**32), bs=st.sampled_from([16, 32, 512]))
def test_same_block_id_same_tokens_anywhere(ids: list[int], seed: int, bs: int) -> None:
    synth = PromptSynth(seed, 32000, bs)
    toks = synth.block_tokens(np.array(ids))
    assert toks.shape == (len(ids), bs)
    assert toks.min() >= 100 and toks.max() < 32000
    for i, b in enumerate(ids):
        np.testing.assert_array_equal(toks[i], synth.block_tokens(np.array([b]))[0])
    rev = synth.block_tokens(np.array(ids[::-1]))
    np.testing.assert_array_equal(rev[::-1], toks)


def test_prompt_is_blocks_then_filler_cut_to_input_length() -> None:
    synth = PromptSynth(7, 1000, 16)
    full = synth.block_tokens(np.array([5, 9]))
    p = synth.prompt(0, np.array([5, 9]), np.array([16, 8]), 24)
    np.testing.assert_array_equal(p, np.concatenate([full[0], full[1][:8]]))
    longer = synth.prompt(3, np.array([5, 9]), np.array([16, 8]), 30)
    assert len(longer) == 30
    np.testing.assert_array_equal(longer[:24], p)
    other = synth.prompt(4, np.array([5, 9]), np.array([16, 8]), 30)
    assert not np.array_equal(longer[24:], other[24:])  # filler is request-unique
    assert len(synth.prompt(0, np.array([5, 9]), np.array([16, 16]), 20)) == 20


def test_tokens_past_the_engines_full_blocks_are_request_unique() -> None:
    """With unique_from (the tokens the engine's full prompt blocks cover) two identical requests share
    those blocks' tokens and nothing after: the engine's partial block, and so the blocks of generated
    tokens that fill it, hash apart, as the simulator's engine model gives every output block an id of
    its own."""
    synth = PromptSynth(7, 1000, 16)
    ids, ntok = np.array([5, 9, 11]), np.array([16, 16, 10])  # 42 tokens; 32-token engine blocks: one full
    a, b = (synth.prompt(r, ids, ntok, 42, unique_from=32) for r in (1, 2))
    plain = synth.prompt(1, ids, ntok, 42)
    assert len(a) == len(b) == 42
    np.testing.assert_array_equal(a[:32], plain[:32])
    np.testing.assert_array_equal(a[:32], b[:32])
    assert not np.array_equal(a[32:], b[32:]) and not np.array_equal(a[32:], plain[32:])
    np.testing.assert_array_equal(synth.prompt(1, ids, ntok, 42, unique_from=48), plain)  # past the end: as is


def test_seed_changes_tokens_and_bad_vocab_is_refused() -> None:
    a = PromptSynth(0, 32000, 16).block_tokens(np.array([1]))
    b = PromptSynth(1, 32000, 16).block_tokens(np.array([1]))
    assert not np.array_equal(a, b)
    with pytest.raises(UsageError, match="vocab-size"):
        PromptSynth(0, 101, 16)

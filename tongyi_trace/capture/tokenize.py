"""The token ids of a captured request's prompt, as the upstream engine counts them (usage.prompt_tokens).

`kvtrace capture` hashes a prompt's token ids into blocks; it never stores text or ids. Where the ids
come from, in this order:
- a completions `prompt` given as token ids (a list of integers, or a one-element list holding one) is
  used as is: no call;
- with a local tokenizer file (`--tokenizer tokenizer.json`, the Hugging Face `tokenizers` format; nothing
  is downloaded): text is encoded with it; a chat request's messages are first rendered with the chat
  template beside it (chat_template.jinja, else tokenizer_config.json's `chat_template`) by a sandboxed
  jinja2 environment set up as Hugging Face transformers sets up its own (which vLLM uses);
- otherwise the upstream's POST /tokenize: vLLM's takes `{"prompt": text}` for completions and
  `{"messages": [...]}` for chat (it applies the chat template with the same add_generation_prompt,
  continue_final_message, chat_template_kwargs and tools as the chat request); SGLang's takes text only
  (`{"prompt": text}`), so a chat request to an SGLang upstream needs `--tokenizer`, said in one line.
Every failure is a TokenizeError whose one line says what to set.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tongyi_trace.errors import KvtraceError

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
TOKENIZE_PATH = "/tokenize"
_INLINE_CHARS = 4096  # a local text up to this long is encoded on the event loop (well under 1 ms)
_FIX = "start the capture with --tokenizer tokenizer.json (the served model's, with its tokenizer_config.json beside)"
# Request fields vLLM's chat tokenize request takes from a chat completion (defaults are vLLM's, the same
# for both: add_generation_prompt true, continue_final_message false, add_special_tokens false).
_CHAT_FIELDS = ("add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
                "chat_template_kwargs", "mm_processor_kwargs", "tools")


class TokenizeError(KvtraceError):
    """No token ids can be had for a prompt; the message (one line) says what to set."""

    exit_code = 2


class TokenSource(Protocol):
    """Where a captured request's prompt token ids come from."""

    async def prompt_token_ids(self, path: str, body: dict[str, Any]) -> list[int]:
        """The prompt's token ids as the upstream engine will see them: path is "/v1/completions" or
        "/v1/chat/completions", body the client's parsed JSON request. A completions `prompt` given as token
        ids is returned as is (no call); text goes through the upstream's /tokenize (for chat: with the
        messages, so the chat template applies) or, when a local tokenizer file is given, the Hugging Face
        `tokenizers` library (chat: the chat template of the tokenizer_config.json beside it, rendered with
        jinja2). Raises TokenizeError when no token ids can be had."""
        ...


def make_token_source(upstream_url: str, session: aiohttp.ClientSession,
                      tokenizer_file: Path | None = None) -> TokenSource:
    """The token source of a capture: the local tokenizer file when given (no upstream call), else the
    upstream's /tokenize through SESSION. A bad tokenizer file is refused here, before any request."""
    if tokenizer_file is not None:
        return LocalTokenSource(tokenizer_file)
    return UpstreamTokenSource(upstream_url, session)


# ----------------------------------------------------------------------------------------- request shape
def _check_ids(ids: list[Any], where: str) -> list[int]:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise TokenizeError(f"{where}: token id {t!r} is not a non-negative integer")
    return list(ids)


def completion_prompt(body: Mapping[str, Any]) -> str | list[int]:
    """The one prompt of a completions request: its text, or its token ids (checked). A list of several
    prompts is a batch: the caller passes one body per prompt."""
    if "prompt" not in body:
        raise TokenizeError("completions request without field 'prompt': nothing to tokenize")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return _check_ids(prompt, "field 'prompt'")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise TokenizeError(f"field 'prompt' is a batch of {len(prompt)} prompts: ask for one prompt at a time")
    raise TokenizeError(f"field 'prompt' is a {type(prompt).__name__}, not text or a list of token ids")


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The messages of a chat completions request (checked to be a list of objects)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        raise TokenizeError("chat request whose field 'messages' is not a list of message objects")
    return msgs


def _check_path(path: str) -> None:
    if path not in (COMPLETIONS_PATH, CHAT_PATH):
        raise TokenizeError(f"{path}: only {COMPLETIONS_PATH} and {CHAT_PATH} prompts are tokenized")


# -------------------------------------------------------------------------------------------- upstream
class UpstreamTokenSource:
    """Token ids from the upstream's POST /tokenize (vLLM: text or chat messages; SGLang: text only)."""

    def __init__(self, upstream_url: str, session: aiohttp.ClientSession) -> None:
        self.url = upstream_url.rstrip("/") + TOKENIZE_PATH
        self.session = session
        self._no_endpoint: str | None = None  # set once the upstream showed it has no /tokenize
        self._no_chat: str | None = None  # set once its /tokenize refused chat messages (SGLang)

    async def prompt_token_ids(self, path: str, body: dict[str, Any]) -> list[int]:
        """See TokenSource.prompt_token_ids."""
        _check_path(path)
        if path == COMPLETIONS_PATH:
            prompt = completion_prompt(body)
            if not isinstance(prompt, str):
                return prompt
            payload: dict[str, Any] = {"prompt": prompt}
            if "add_special_tokens" in body:
                payload["add_special_tokens"] = body["add_special_tokens"]
        else:
            payload = {"messages": chat_messages(body)}
            payload.update({k: body[k] for k in _CHAT_FIELDS if k in body})
            if self._no_chat is not None:
                raise TokenizeError(self._no_chat)
        if isinstance(body.get("model"), str):
            payload["model"] = body["model"]
        if self._no_endpoint is not None:
            raise TokenizeError(self._no_endpoint)
        return await self._post(payload, chat=path == CHAT_PATH)

    async def _post(self, payload: dict[str, Any], chat: bool) -> list[int]:
        try:
            async with self.session.post(self.url, json=payload) as resp:
                status = resp.status
                raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TokenizeError(f"POST {self.url} failed ({type(e).__name__}: {_one_line(str(e))}); "
                                f"is the upstream up? Or {_FIX}") from e
        text = raw.decode("utf-8", errors="replace")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
        if status == 200 and isinstance(doc, dict) and isinstance(doc.get("tokens"), list):
            return _check_ids(doc["tokens"], f"POST {self.url} answer")
        message = _error_message(doc, text)
        if status in (404, 405) and (doc is None or message in ("Not Found", "Method Not Allowed")):
            self._no_endpoint = f"the upstream has no {TOKENIZE_PATH} (POST {self.url}: HTTP {status}); {_FIX}"
            raise TokenizeError(self._no_endpoint)
        if status in (400, 500, 501) and ("skip_tokenizer_init" in message
                                          or "tokenizer not available" in message.lower()):  # vLLM without one
            self._no_endpoint = (f"the upstream cannot tokenize (POST {self.url}: HTTP {status}: "
                                 f"{_one_line(message)}); {_FIX}, or send token-id prompts")
            raise TokenizeError(self._no_endpoint)
        low = message.lower()
        if chat and status in (400, 422) and "prompt" in low and ("required" in low or "missing" in low):
            self._no_chat = (f"the upstream's {TOKENIZE_PATH} takes text only, no chat messages (SGLang's does; "
                             f"HTTP {status}: {_one_line(message)}); {_FIX}")
            raise TokenizeError(self._no_chat)
        if status == 200:
            raise TokenizeError(f"POST {self.url} answered without a list 'tokens' ({_one_line(text)}); "
                                f"is the upstream vLLM or SGLang? Or {_FIX}")
        raise TokenizeError(f"POST {self.url}: HTTP {status}: {_one_line(message)}")


def _error_message(doc: Any, text: str) -> str:
    """The error text of an upstream answer: vLLM {"error": {"message"}}, FastAPI {"detail"}, or the body."""
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(doc.get("message"), str):
            return str(doc["message"])
        if "detail" in doc:
            d = doc["detail"]
            return d if isinstance(d, str) else json.dumps(d)
    return text


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


# ----------------------------------------------------------------------------------------------- local
class LocalTokenSource:
    """Token ids from a local Hugging Face tokenizer.json; chat through the chat template beside it."""

    def __init__(self, tokenizer_file: Path) -> None:
        from tokenizers import Tokenizer

        self.path = Path(tokenizer_file)
        if not self.path.is_file():
            raise TokenizeError(f"--tokenizer {self.path}: no such file; give the served model's tokenizer.json")
        try:
            self.tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as e:  # the library raises a bare Exception for a malformed file
            raise TokenizeError(f"--tokenizer {self.path}: not a Hugging Face tokenizer.json ({_one_line(str(e))})"
                                ) from e
        self.config = _read_config(self.path.parent / "tokenizer_config.json")
        self.chat_template = _chat_template(self.path.parent, self.config)
        self._templates: dict[str, Any] = {}

    async def prompt_token_ids(self, path: str, body: dict[str, Any]) -> list[int]:
        """See TokenSource.prompt_token_ids."""
        _check_path(path)
        if path == COMPLETIONS_PATH:
            prompt = completion_prompt(body)
            if not isinstance(prompt, str):
                return prompt
            return await self._encode_off_loop(prompt, bool(body.get("add_special_tokens", True)))
        text = self.render_chat(body)
        return await self._encode_off_loop(text, bool(body.get("add_special_tokens", False)))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """TEXT's token ids (ADD_SPECIAL_TOKENS: the tokenizer's post-processor adds BOS/EOS if it has any)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    async def _encode_off_loop(self, text: str, add_special_tokens: bool) -> list[int]:
        """encode, in a worker thread for a long text: `encode` holds the GIL (a 4,000-token text took ~20 ms
        on this 2-core machine, which would stall every stream of the proxy), `encode_batch` releases it."""
        if len(text) <= _INLINE_CHARS:
            return self.encode(text, add_special_tokens)
        return await asyncio.to_thread(self._encode_released, text, add_special_tokens)

    def _encode_released(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def render_chat(self, body: Mapping[str, Any]) -> str:
        """The prompt text of a chat request: its messages through the chat template, with the request's
        add_generation_prompt (default true), continue_final_message, tools and chat_template_kwargs."""
        messages = chat_messages(body)
        tools = body.get("tools")
        template = body.get("chat_template") or self._pick_template(tools)
        if template is None:
            raise TokenizeError(f"--tokenizer {self.path}: no chat template beside it (chat_template.jinja, or "
                                "'chat_template' in tokenizer_config.json); give the served model's files")
        add_gen = body.get("add_generation_prompt", True)
        cont = bool(body.get("continue_final_message", False))
        if cont and add_gen:
            raise TokenizeError("chat request sets both continue_final_message and add_generation_prompt")
        list_content = _iterates_content(template)
        conversation = [_normalize_message(m, list_content, i) for i, m in enumerate(messages)]
        kwargs: dict[str, Any] = dict(_special_tokens(self.config))
        extra = body.get("chat_template_kwargs")
        if isinstance(extra, dict):
            kwargs.update(extra)
        kwargs.update(messages=conversation, tools=tools, documents=body.get("documents"),
                      add_generation_prompt=bool(add_gen) and not cont)
        try:
            rendered: str = self._compiled(template).render(**kwargs)
        except TokenizeError:
            raise
        except Exception as e:  # a template error of any kind is the user's template's
            raise TokenizeError(f"chat template of {self.path.parent} failed: {_one_line(str(e))}") from e
        if cont:
            rendered = _cut_after_final_message(rendered, conversation)
        return rendered

    def _pick_template(self, tools: Any) -> str | None:
        t = self.chat_template
        if isinstance(t, dict):  # named templates: "tool_use" when the request has tools, else "default"
            if tools and "tool_use" in t:
                return str(t["tool_use"])
            return str(t["default"]) if "default" in t else None
        return t

    def _compiled(self, template: str) -> Any:
        if template not in self._templates:
            self._templates[template] = _jinja_env().from_string(template)
        return self._templates[template]


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizeError(f"{path}: unreadable ({_one_line(str(e))}); fix or remove it") from e
    if not isinstance(doc, dict):
        raise TokenizeError(f"{path}: not a JSON object; fix or remove it")
    return doc


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """chat_template.jinja beside the tokenizer (transformers saves it there), else the config's entry: a
    string, or a list of {"name", "template"}."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    t = config.get("chat_template")
    if isinstance(t, str):
        return t
    if isinstance(t, list):
        named = {str(x["name"]): str(x["template"]) for x in t
                 if isinstance(x, dict) and "name" in x and "template" in x}
        return named or None
    return None


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """bos_token, eos_token... of tokenizer_config.json as strings (an added-token object: its content)."""
    out: dict[str, str] = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
        v = config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[key] = v
    return out


_CONTENT_LOOP = re.compile(r"\{%-?\s*for\s+\w+\s+in\s+[\w.]+(\[['\"]content['\"]\]|\.content)")


def _iterates_content(template: str) -> bool:
    """True when the template loops over a message's content (OpenAI list-of-parts form); else vLLM passes
    content as one string (its text parts joined with newlines)."""
    return bool(_CONTENT_LOOP.search(template))


def _normalize_message(msg: Mapping[str, Any], list_content: bool, index: int) -> dict[str, Any]:
    """A message as the template sees it: text parts joined with "\\n" unless the template loops over them."""
    out = dict(msg)
    content = msg.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text") and "text" in part:
                texts.append(str(part["text"]))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise TokenizeError(f"message {index}: a {kind!r} content part cannot be tokenized locally "
                                    "(the engine's processor expands it); capture without --tokenizer so the "
                                    "upstream's /tokenize counts it")
        out["content"] = [{"type": "text", "text": t} for t in texts] if list_content else "\n".join(texts)
    return out


def _cut_after_final_message(rendered: str, conversation: list[dict[str, Any]]) -> str:
    """continue_final_message: the prompt ends right after the final message's text (as transformers does)."""
    final = conversation[-1].get("content") if conversation else None
    if isinstance(final, list):
        final = "\n".join(str(p.get("text", "")) for p in final if isinstance(p, dict))
    if not isinstance(final, str) or not final.strip():
        return rendered
    at = rendered.rfind(final.strip())
    if at < 0:
        raise TokenizeError("continue_final_message: the final message's text is not in the rendered prompt")
    return rendered[: at + len(final.strip())]


def _raise(message: str) -> None:
    raise TokenizeError(f"chat template: {message}")


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant masks in transformers): renders its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares it a class attribute)

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _jinja_env() -> ImmutableSandboxedEnvironment:
    """A sandboxed jinja2 environment as transformers renders chat templates: trim and lstrip blocks, loop
    controls, raise_exception, strftime_now and a tojson that keeps non-ASCII text."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env

"""Request types of captured requests (tongyi_trace/capture/content.py; the rules of the README)."""

from __future__ import annotations

from typing import Any

import pytest

from tongyi_trace.capture.content import request_type

CHAT = "/v1/chat/completions"


def _chat(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}], **extra}


@pytest.mark.parametrize(("body", "expected"), [
    (_chat(), "text"),
    ({"messages": [{"role": "user", "content": "plain string"}]}, "text"),
    (_chat({"type": "image_url", "image_url": {"url": "data:"}}), "image"),
    (_chat({"type": "input_audio", "input_audio": {}}), "image"),
    (_chat({"type": "video_url", "video_url": {}}), "image"),
    (_chat({"type": "file", "file": {"file_id": "f"}}), "file"),
    # an image wins over a file, a file over search
    (_chat({"type": "file", "file": {}}, {"type": "image_url", "image_url": {}}), "image"),
    (_chat({"type": "file", "file": {}}, enable_search=True), "file"),
    (_chat(enable_search=True), "search"),
    (_chat(enable_search=False), "text"),
    (_chat(web_search_options={}), "search"),
    (_chat(tools=[{"type": "web_search_preview"}]), "search"),
    (_chat(tools=[{"type": "function", "function": {"name": "Web_Search"}}]), "search"),
    (_chat(tools=[{"type": "function", "function": {"name": "get_weather"}}]), "text"),
    (_chat(tools="not a list", messages_extra=None), "text"),
])
def test_chat_types(body: dict[str, Any], expected: str) -> None:
    assert request_type(CHAT, body) == expected


def test_completions_are_text_unless_they_ask_for_search() -> None:
    assert request_type("/v1/completions", {"prompt": "hi"}) == "text"
    # content parts only exist in chat: a completions body that looks like one is still text
    assert request_type("/v1/completions", _chat({"type": "image_url"})) == "text"
    assert request_type("/v1/completions", {"prompt": "hi", "enable_search": True}) == "search"

"""The request type of a captured request (the Qwen-Bailian `type`), from its content parts and tools.

Rules (README "Your own traffic"), first match wins:
1. `image`: a chat message has an image, video or audio content part (`image_url`, `input_image`,
   `image`, `video_url`, `video`, `input_audio`, `audio_url`): the multimodal type of the paper's trace A;
2. `file`: a message has a file content part (`file`, `input_file`);
3. `search`: the request enables web search: a tool of type `web_search*`, a function tool whose name
   contains "search", `web_search_options` (OpenAI) or `enable_search: true` (DashScope);
4. `text`: everything else (a /v1/completions request has no content parts: text unless rule 3).
"""

from __future__ import annotations

from typing import Any

IMAGE_PARTS = frozenset({"image_url", "input_image", "image", "video_url", "video", "input_audio", "audio_url"})
FILE_PARTS = frozenset({"file", "input_file"})
REQUEST_TYPES = ("image", "file", "search", "text")


def _part_types(body: dict[str, Any]) -> set[str]:
    kinds: set[str] = set()
    messages = body.get("messages")
    if not isinstance(messages, list):
        return kinds
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            kinds.update(str(p["type"]) for p in content if isinstance(p, dict) and isinstance(p.get("type"), str))
    return kinds


def _searches(body: dict[str, Any]) -> bool:
    if body.get("enable_search") is True or isinstance(body.get("web_search_options"), dict):
        return True
    tools = body.get("tools")
    if not isinstance(tools, list):
        return False
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if isinstance(kind, str) and kind.startswith("web_search"):
            return True
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and "search" in name.lower():
            return True
    return False


def request_type(path: str, body: dict[str, Any]) -> str:
    """The type of the request BODY sent to PATH (module doc): image, file, search or text."""
    if path.endswith("/chat/completions"):
        parts = _part_types(body)
        if parts & IMAGE_PARTS:
            return "image"
        if parts & FILE_PARTS:
            return "file"
    if _searches(body):
        return "search"
    return "text"

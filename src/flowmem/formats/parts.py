"""Content parts between dialects: text, images, files, refusals, thinking.

Canonical content keeps the parts as they came (OpenAI Chat ``text`` /
``image_url`` / ``input_audio`` / ``file`` / ``refusal``; Responses
``input_text`` / ``output_text`` / ``input_image`` / ``input_file`` /
``refusal``; Anthropic ``text`` / ``image`` / ``document`` / ``thinking`` /
``redacted_thinking`` / ...). Each function here renders one part for one
target and role, or returns ``None`` after counting it in ``losses`` when the
target cannot carry it there. Nothing is ever turned into text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._common import Losses

__all__ = ["anthropic_block", "chat_part", "part_text", "responses_part"]

Part = dict[str, Any]

TEXT_TYPES: Final = frozenset({"text", "input_text", "output_text"})
_IMAGE_MEDIA: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_ANTHROPIC_PASS: Final = frozenset({
    "image", "document", "search_result", "thinking", "redacted_thinking",
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
    "code_execution_tool_result", "container_upload",
})
_ANTHROPIC_USER: Final = frozenset({"image", "document", "search_result", "container_upload"})
_ANTHROPIC_TOOL: Final = frozenset({"image", "document", "search_result"})
_TEXT_FIELDS: Final = frozenset({"type", "text"})
_IMAGE_FIELDS: Final = frozenset({"type", "image_url", "detail", "source"})
"""What an image conversion reads, in any dialect (the rest is counted lost)."""
_FILE_FIELDS: Final = frozenset({"type", "file", "file_data", "file_id", "filename",
                                 "source", "title"})
"""What a file conversion reads, in any dialect (a document's ``context``,
``citations``, ``cache_control`` are counted lost)."""


def part_text(part: Mapping[str, Any]) -> str | None:
    """The text of a text part of any dialect, else ``None``."""
    text = part.get("text")
    return text if part.get("type") in TEXT_TYPES and isinstance(text, str) else None


def _lose_extras(part: Mapping[str, Any], allowed: frozenset[str], losses: Losses) -> None:
    for key, value in part.items():
        if key not in allowed and value not in (None, [], {}):
            losses.lose(f"{part.get('type')}.{key}")


def _data_url(url: Any) -> tuple[str, str] | None:
    """``(media_type, base64 data)`` of a ``data:`` URL, else ``None``."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        return None
    head, data = url[5:].split(";base64,", 1)
    return head, data


def _image_url(part: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(url, detail)`` of an image part of any dialect (``url`` may be a data URL)."""
    kind = part.get("type")
    if kind == "image_url":
        body = part.get("image_url")
        if isinstance(body, Mapping):
            return body.get("url"), body.get("detail")
    elif kind == "input_image":
        return part.get("image_url"), part.get("detail")
    elif kind == "image":
        source = part.get("source")
        if isinstance(source, Mapping) and source.get("type") == "base64":
            return f"data:{source.get('media_type')};base64,{source.get('data')}", None
        if isinstance(source, Mapping) and source.get("type") == "url":
            return source.get("url"), None
    return None, None


def _file_data(part: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """``(file_data data URL, file_id, filename)`` of a file part of any dialect."""
    kind = part.get("type")
    if kind == "file":
        body = part.get("file")
        if isinstance(body, Mapping):
            return body.get("file_data"), body.get("file_id"), body.get("filename")
    elif kind == "input_file":
        return part.get("file_data"), part.get("file_id"), part.get("filename")
    elif kind == "document":
        source = part.get("source")
        if isinstance(source, Mapping) and source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
            return url, None, part.get("title")
    return None, None, None


# --------------------------------------------------------------------------- OpenAI Chat

def chat_part(part: Mapping[str, Any], role: str, losses: Losses) -> Part | None:
    """One part as an OpenAI Chat content part for ``role``, or ``None`` (counted)."""
    kind = part.get("type")
    text = part_text(part)
    if text is not None:
        _lose_extras(part, _TEXT_FIELDS, losses)
        return {"type": "text", "text": text}
    if kind == "refusal" and role == "assistant" and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if role == "user":
        rendered = _chat_user_part(part, losses)
        if rendered is not None:
            return rendered
    losses.lose(f"{kind} part")
    return None


def _chat_user_part(part: Mapping[str, Any], losses: Losses) -> Part | None:
    kind = part.get("type")
    if kind in ("image_url", "input_audio", "file"):
        return dict(part)
    url, detail = _image_url(part)
    if url is not None:
        body: dict[str, Any] = {"url": url}
        if detail in ("auto", "low", "high"):
            body["detail"] = detail
        _lose_extras(part, _IMAGE_FIELDS, losses)
        return {"type": "image_url", "image_url": body}
    data, file_id, filename = _file_data(part)
    if data is not None or file_id is not None:
        _lose_extras(part, _FILE_FIELDS, losses)
        file = {k: v for k, v in (("file_data", data), ("file_id", file_id),
                                  ("filename", filename)) if v is not None}
        return {"type": "file", "file": file}
    return None


# --------------------------------------------------------------------------- Anthropic

def anthropic_block(part: Mapping[str, Any], role: str, losses: Losses) -> Part | None:
    """One part as an Anthropic content block for ``role`` (``"tool"``: inside a
    ``tool_result``), or ``None`` (counted). Empty text is dropped (Anthropic
    refuses empty text blocks)."""
    kind = part.get("type")
    text = part_text(part)
    if text is not None:
        if kind == "text":
            block = dict(part)
        else:
            _lose_extras(part, _TEXT_FIELDS, losses)
            block = {"type": "text", "text": text}
        if text == "":
            losses.lose("empty text block")
            return None
        return block
    allowed = (_ANTHROPIC_PASS if role == "assistant"
               else _ANTHROPIC_USER if role == "user" else _ANTHROPIC_TOOL)
    if kind in allowed:
        return dict(part)
    if role != "assistant":
        rendered = _anthropic_media(part, losses)
        if rendered is not None:
            return rendered
    losses.lose(f"{kind} part")
    return None


def _anthropic_media(part: Mapping[str, Any], losses: Losses) -> Part | None:
    url, detail = _image_url(part)
    if url is not None:
        data = _data_url(url)
        if data is not None and data[0] in _IMAGE_MEDIA:
            source: dict[str, Any] = {"type": "base64", "media_type": data[0], "data": data[1]}
        elif data is None and url.startswith(("http://", "https://")):
            source = {"type": "url", "url": url}
        else:
            return None
        if detail not in (None, "auto"):
            losses.lose(f"{part.get('type')}.detail")
        _lose_extras(part, _IMAGE_FIELDS, losses)
        return {"type": "image", "source": source}
    file_data, _file_id, filename = _file_data(part)
    data = _data_url(file_data)
    if data is not None and data[0] == "application/pdf":
        block: Part = {"type": "document", "source": {"type": "base64",
                                                      "media_type": data[0], "data": data[1]}}
        if filename:
            block["title"] = filename
        _lose_extras(part, _FILE_FIELDS, losses)
        return block
    return None


# --------------------------------------------------------------------------- Responses

def responses_part(part: Mapping[str, Any], role: str, losses: Losses) -> Part | None:
    """One part for a Responses item: ``output_text``/``refusal`` for an assistant
    message, ``input_*`` otherwise (``"tool"``: a function output), or ``None`` (counted)."""
    kind = part.get("type")
    text = part_text(part)
    if role == "assistant":
        if kind in ("output_text", "refusal"):
            return dict(part)
        if text is not None:
            _lose_extras(part, frozenset({"type", "text"}), losses)
            return {"type": "output_text", "text": text, "annotations": []}
    elif text is not None:
        if kind == "input_text":
            return dict(part)
        _lose_extras(part, _TEXT_FIELDS, losses)
        return {"type": "input_text", "text": text}
    elif kind in ("input_image", "input_file"):
        return dict(part)
    else:
        rendered = _responses_media(part, losses)
        if rendered is not None:
            return rendered
    losses.lose(f"{kind} part")
    return None


def _responses_media(part: Mapping[str, Any], losses: Losses) -> Part | None:
    url, detail = _image_url(part)
    if url is not None:
        _lose_extras(part, _IMAGE_FIELDS, losses)
        return {"type": "input_image", "image_url": url,
                "detail": detail if detail in ("auto", "low", "high") else "auto"}
    data, file_id, filename = _file_data(part)
    if data is None and file_id is None:
        return None
    _lose_extras(part, _FILE_FIELDS, losses)
    rendered: Part = {"type": "input_file"}
    for key, value in (("file_data", data), ("file_id", file_id), ("filename", filename)):
        if value is not None:
            rendered[key] = value
    return rendered

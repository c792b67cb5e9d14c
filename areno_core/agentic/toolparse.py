"""Turn a model's reply text into an OpenAI assistant message: content plus ``tool_calls``.

Two forms are read:

* ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>`` blocks anywhere in the text (the
  form Qwen-style chat templates, and the areno byte tokenizer's template, ask for); any name is
  accepted, since the model used the explicit markup;
* a plain-JSON fallback: the whole reply (optionally inside a ```json fence) is one object
  ``{"name": ..., "arguments": ...}`` or a list of them, and every name is one of the request's
  tools.

Arguments may be an object or a JSON string holding one. Anything that does not parse stays in
the content as text, so nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection, Mapping
from typing import Any

from areno_core.models.chat import parse_tool_calls

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def new_call_id() -> str:
    """A fresh tool-call id in the OpenAI style (``call_`` + 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_tool_call(name: str, arguments: Mapping[str, Any], call_id: str | None = None) -> dict:
    """One ``message.tool_calls`` entry; ``arguments`` is serialised as a JSON string."""
    return {
        "id": call_id or new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(dict(arguments), ensure_ascii=False)},
    }


def tool_names(tools: Any) -> set[str]:
    """The function names declared in an OpenAI ``tools`` list (malformed entries skipped)."""
    names: set[str] = set()
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        source = function if isinstance(function, Mapping) else tool
        name = source.get("name")
        if isinstance(name, str):
            names.add(name)
    return names


def _decode_call(value: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        return None
    if set(value) - {"name", "arguments", "parameters"}:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, Mapping):
        return None
    return value["name"], dict(arguments)


def parse_json_calls(
    text: str, allowed_names: Collection[str]
) -> list[tuple[str, dict[str, Any]]] | None:
    """The plain-JSON fallback: the calls when the whole ``text`` is one call object (or a list
    of them) naming only ``allowed_names``, else None."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    if not body or body[0] not in "{[":
        return None
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    values = value if isinstance(value, list) else [value]
    calls = [_decode_call(v) for v in values]
    if not calls or any(c is None or c[0] not in allowed_names for c in calls):
        return None
    return [c for c in calls if c is not None]


def parse_assistant_text(
    text: str, *, tools: Any = None, parse_tools: bool = True
) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of an OpenAI assistant message for the model's ``text``.

    ``tool_calls`` are OpenAI entries (fresh ids, arguments as JSON strings). Without
    ``parse_tools`` (no tools in the request, or ``tool_choice="none"``) the text is returned
    as is. ``content`` is None when tool calls took the whole reply.
    """
    if not parse_tools:
        return text, []
    content, calls = parse_tool_calls(text)
    if calls:
        entries = [openai_tool_call(c["name"], c["arguments"]) for c in calls]
        return (content or None), entries
    fallback = parse_json_calls(text, tool_names(tools))
    if fallback:
        return None, [openai_tool_call(name, arguments) for name, arguments in fallback]
    return text, []


__all__ = [
    "new_call_id",
    "openai_tool_call",
    "parse_assistant_text",
    "parse_json_calls",
    "tool_names",
]

"""Reading a model's tool calls and answers out of a reward record, defensively.

A reward function must never raise on what a model produced, so every helper here returns
``None`` (or an empty list) for anything it cannot read instead of raising.

Tool calls are OpenAI-style dicts, ``{"function": {"name": ..., "arguments": ...}}`` where the
arguments are a JSON string or an already-decoded dict; a flat ``{"name": ..., "arguments":
...}`` is accepted too. When ``record.tool_calls`` is empty, the ``tool_calls`` of assistant
messages in ``record.messages`` are used instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
# A completion longer than this is only searched in its tail (the final answer comes last).
MAX_TEXT_CHARS = 20_000


def record_tool_calls(record: Any) -> list[Mapping[str, Any]]:
    """The tool calls of ``record`` in order; ``[]`` when there are none or they are unreadable."""
    calls = _as_list(getattr(record, "tool_calls", None))
    if calls:
        return [c for c in calls if isinstance(c, Mapping)]
    found: list[Mapping[str, Any]] = []
    for message in _as_list(getattr(record, "messages", None)):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            found.extend(c for c in _as_list(message.get("tool_calls")) if isinstance(c, Mapping))
    return found


def call_name(call: Mapping[str, Any]) -> str | None:
    """The function name of one tool call, or None."""
    function = call.get("function")
    source = function if isinstance(function, Mapping) else call
    name = source.get("name")
    return name if isinstance(name, str) else None


def call_arguments(call: Mapping[str, Any]) -> Any:
    """The decoded arguments of one tool call (usually a dict), or None when unreadable."""
    function = call.get("function")
    source = function if isinstance(function, Mapping) else call
    arguments = source.get("arguments")
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if isinstance(arguments, Mapping | list):
        return arguments
    return None


def first_call_arguments(record: Any, name: str) -> tuple[bool, Any]:
    """``(found, arguments)`` for the first tool call named ``name`` in ``record``.

    Only the first call to the tool counts (it is the move the model committed to); its
    arguments are None when they cannot be decoded.
    """
    for call in record_tool_calls(record):
        if call_name(call) == name:
            return True, call_arguments(call)
    return False, None


def answer_text(record: Any) -> str:
    """The completion text without ``<think>...</think>`` blocks, limited to its tail."""
    text = getattr(record, "completion", "")
    if not isinstance(text, str):
        return ""
    text = text[-4 * MAX_TEXT_CHARS :]
    return _THINK.sub(" ", text)[-MAX_TEXT_CHARS:]


def record_row(record: Any) -> Mapping[str, Any]:
    """The dataset row of ``record``, or ``{}``."""
    row = getattr(record, "row", None)
    return row if isinstance(row, Mapping) else {}


def as_int(value: Any) -> int | None:
    """``value`` as an int when it is an integer, an integral float or a digit string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,6}\s*", value):
        return int(value)
    return None


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


__all__ = [
    "MAX_TEXT_CHARS",
    "answer_text",
    "as_int",
    "call_arguments",
    "call_name",
    "first_call_arguments",
    "record_row",
    "record_tool_calls",
]

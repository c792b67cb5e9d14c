"""Reading a model's tool calls and answers out of a reward record, defensively.

A reward function must never raise on what a model produced, so every helper here returns
``None`` (or an empty list) for anything it cannot read instead of raising.

Tool calls are OpenAI-style dicts, ``{"function": {"name": ..., "arguments": ...}}`` where the
arguments are a JSON string or an already-decoded dict; a flat ``{"name": ..., "arguments":
...}`` is accepted too. When ``record.tool_calls`` is empty, the ``tool_calls`` of assistant
messages in ``record.messages`` are used instead.

Multi-turn records (an agent that talked to the model more than once, or that recorded what
the model's reply led to) are read turn by turn with :func:`assistant_turns`: one entry per
assistant message of ``record.messages``, holding that message's tool calls and its text.

The other way round, :func:`function_tool` builds the OpenAI tool a game offers the model.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
# A completion longer than this is only searched in its tail (the final answer comes last).
MAX_TEXT_CHARS = 20_000
# At most this many assistant messages of a record are read.
MAX_TURNS = 64


def function_tool(
    name: str, parameters: Mapping[str, Any], description: str | None = None
) -> dict[str, Any]:
    """The OpenAI tool ``{"type": "function", "function": {...}}`` offering ``name`` with the
    JSON schema ``parameters``, as a fresh dict (safe to modify); without ``description`` the
    function has no description key."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = copy.deepcopy(dict(parameters))
    return {"type": "function", "function": function}


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
    return first_named_call(record_tool_calls(record), name)


def answer_text(record: Any) -> str:
    """The completion text without ``<think>...</think>`` blocks, limited to its tail."""
    return clean_text(getattr(record, "completion", ""))


def clean_text(text: Any) -> str:
    """``text`` without ``<think>...</think>`` blocks, limited to its tail; ``""`` if not text."""
    if not isinstance(text, str):
        return ""
    text = text[-4 * MAX_TEXT_CHARS :]
    return _THINK.sub(" ", text)[-MAX_TEXT_CHARS:]


@attrs.frozen
class AssistantTurn:
    """What the model said in one assistant message: its tool calls and its text."""

    tool_calls: tuple[Mapping[str, Any], ...]
    text: str


def message_turn(message: Any) -> AssistantTurn:
    """The tool calls and text of one assistant message (a dict or an object with attributes).

    Calls come from the message's ``tool_calls``; a message without any, whose text holds
    ``<tool_call>{...}</tool_call>`` blocks (the form areno's chat template asks for), has
    those blocks read as its calls. The text is :func:`clean_text` of the content.
    """
    if isinstance(message, Mapping):
        calls, content = message.get("tool_calls"), message.get("content")
    else:
        calls, content = getattr(message, "tool_calls", None), getattr(message, "content", None)
    found = [_plain(c) for c in _as_list(calls)]
    found = [c for c in found if isinstance(c, Mapping)]
    text = content if isinstance(content, str) else ""
    if not found and "<tool_call>" in text:
        found = _tagged_calls(text)
    return AssistantTurn(tool_calls=tuple(found), text=clean_text(text))


def assistant_turns(record: Any) -> list[AssistantTurn] | None:
    """The record's assistant messages in order, for a multi-turn record; else None.

    A record is multi-turn when ``record.messages`` holds two or more assistant messages, or
    one that other messages follow (an agent's tool results: the conversation went on after
    the reply). None means a single-turn record (no assistant message, or one that ends the
    conversation): read it with :func:`record_tool_calls` and :func:`answer_text`.

    When the last assistant message carries no calls of its own but ``record.tool_calls``
    holds more calls than the earlier messages, the extra calls are the last message's (a
    record whose final message is plain text with the calls parsed apart).
    """
    conversation = [
        m for m in _as_list(getattr(record, "messages", None)) if isinstance(m, Mapping)
    ]
    where = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
    if not where or (len(where) == 1 and where[0] == len(conversation) - 1):
        return None
    messages = [conversation[i] for i in where]
    turns = [message_turn(m) for m in messages[:MAX_TURNS]]
    last = turns[-1]
    if not last.tool_calls:
        flat = [c for c in _as_list(getattr(record, "tool_calls", None)) if isinstance(c, Mapping)]
        earlier = sum(len(t.tool_calls) for t in turns[:-1])
        if len(flat) > earlier:
            turns[-1] = AssistantTurn(tool_calls=tuple(flat[earlier:]), text=last.text)
    return turns


def first_named_call(calls: Any, name: str) -> tuple[bool, Any]:
    """``(found, arguments)`` for the first call named ``name`` among ``calls``."""
    for call in _as_list(calls):
        if isinstance(call, Mapping) and call_name(call) == name:
            return True, call_arguments(call)
    return False, None


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


def _plain(call: Any) -> Any:
    """A tool call as a dict (OpenAI client objects have ``model_dump``)."""
    dump = getattr(call, "model_dump", None)
    if callable(dump) and not isinstance(call, Mapping):
        try:
            return dump()
        except Exception:
            return None
    return call


def _tagged_calls(text: str) -> list[Mapping[str, Any]]:
    calls: list[Mapping[str, Any]] = []
    for body in _TOOL_CALL.findall(text[-4 * MAX_TEXT_CHARS :]):
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            calls.append({"name": value["name"], "arguments": value.get("arguments")})
    return calls


__all__ = [
    "MAX_TEXT_CHARS",
    "MAX_TURNS",
    "AssistantTurn",
    "answer_text",
    "as_int",
    "assistant_turns",
    "call_arguments",
    "call_name",
    "clean_text",
    "first_call_arguments",
    "first_named_call",
    "message_turn",
    "record_row",
    "record_tool_calls",
]

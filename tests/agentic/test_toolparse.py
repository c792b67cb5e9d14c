"""Reading tool calls out of model text."""

from __future__ import annotations

import json

from areno_core.agentic.toolparse import parse_assistant_text, parse_json_calls, tool_names

TOOLS = [
    {"type": "function", "function": {"name": "choose_square", "parameters": {}}},
    {"type": "function", "function": {"name": "look", "parameters": {}}},
]


def _calls(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_parse_qwen_block_with_text_returns_content_and_call() -> None:
    text = (
        "Taking the centre.\n"
        '<tool_call>{"name": "choose_square", "arguments": {"square": 5}}</tool_call>'
    )
    content, calls = parse_assistant_text(text, tools=TOOLS)
    assert content == "Taking the centre."
    assert _calls(calls) == [("choose_square", {"square": 5})]
    assert calls[0]["type"] == "function"
    assert calls[0]["id"].startswith("call_") and len(calls[0]["id"]) == 29


def test_parse_several_blocks_returns_calls_in_order_with_distinct_ids() -> None:
    text = (
        '<tool_call>{"name": "look", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "choose_square", "arguments": "{\\"square\\": 1}"}</tool_call>'
    )
    content, calls = parse_assistant_text(text, tools=TOOLS)
    assert content is None
    assert _calls(calls) == [("look", {}), ("choose_square", {"square": 1})]
    assert calls[0]["id"] != calls[1]["id"]


def test_parse_block_with_undeclared_name_still_returns_call() -> None:
    content, calls = parse_assistant_text(
        '<tool_call>{"name": "other", "arguments": {"x": 1}}</tool_call>', tools=TOOLS
    )
    assert content is None and _calls(calls) == [("other", {"x": 1})]


def test_parse_whole_json_reply_naming_a_tool_returns_call() -> None:
    content, calls = parse_assistant_text(
        ' {"name": "choose_square", "arguments": {"square": 3}} ', tools=TOOLS
    )
    assert content is None
    assert _calls(calls) == [("choose_square", {"square": 3})]


def test_parse_fenced_json_list_returns_every_call() -> None:
    calls_json = json.dumps(
        [{"name": "look", "arguments": {}}, {"name": "choose_square", "parameters": {"square": 2}}]
    )
    text = f"```json\n{calls_json}\n```"
    _, calls = parse_assistant_text(text, tools=TOOLS)
    assert _calls(calls) == [("look", {}), ("choose_square", {"square": 2})]


def test_parse_json_reply_with_unknown_name_stays_text() -> None:
    text = '{"name": "Bob", "arguments": {"age": 3}}'
    assert parse_assistant_text(text, tools=TOOLS) == (text, [])
    assert parse_json_calls(text, tool_names(TOOLS)) is None


def test_parse_malformed_block_stays_text() -> None:
    text = 'Hmm <tool_call>{"name": "choose_square", "arguments": {"square": </tool_call>'
    assert parse_assistant_text(text, tools=TOOLS) == (text, [])


def test_parse_unclosed_block_stays_text() -> None:
    text = '<tool_call>{"name": "choose_square", "arguments": {"square": 5}}'
    assert parse_assistant_text(text, tools=TOOLS) == (text, [])


def test_parse_mixed_good_and_bad_blocks_keeps_bad_one_as_text() -> None:
    text = '<tool_call>{"name": "look", "arguments": {}}</tool_call><tool_call>not json</tool_call>'
    content, calls = parse_assistant_text(text, tools=TOOLS)
    assert _calls(calls) == [("look", {})]
    assert content == "<tool_call>not json</tool_call>"


def test_parse_with_parsing_off_returns_text_unchanged() -> None:
    text = '<tool_call>{"name": "look", "arguments": {}}</tool_call>'
    assert parse_assistant_text(text, tools=TOOLS, parse_tools=False) == (text, [])


def test_tool_names_with_malformed_entries_skips_them() -> None:
    assert tool_names([*TOOLS, "x", {"function": {"name": 3}}, {"name": "flat"}]) == {
        "choose_square",
        "look",
        "flat",
    }

"""The byte-level tokenizer and its ChatML chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from areno_core.models.tokenizer import (
    CHAT_TEMPLATE,
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    build_byte_tokenizer,
)

TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "héllo wörld — ñandú",
    "数学 问题: 2 + 3 = 5",
    "emoji 🌍🚀 family 👨‍👩‍👧 flag 🇫🇷",
    "control \x00\x01\x7f chars",
    "<think>nested</think> and <|im_end|> inline",
]

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return build_byte_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_any_text_roundtrips_exactly(
    tok: PreTrainedTokenizerBase, text: str
) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_byte_tokenizer_plain_text_ids_are_utf8_bytes(tok: PreTrainedTokenizerBase) -> None:
    text = "aé 🌍\n"
    assert tok.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))


def test_byte_tokenizer_special_tokens_encode_as_single_ids(
    tok: PreTrainedTokenizerBase,
) -> None:
    ids = [tok.encode(t, add_special_tokens=False) for t in SPECIAL_TOKENS]
    assert ids == [[256 + i] for i in range(len(SPECIAL_TOKENS))]
    assert len(tok) == 256 + len(SPECIAL_TOKENS)
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 256
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 258
    assert tok.bos_token is None


def test_byte_tokenizer_skip_special_tokens_keeps_markup(tok: PreTrainedTokenizerBase) -> None:
    ids = tok.encode("<|im_start|>x<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "x<tool_call>{}</tool_call>"
    assert all(t not in tok.all_special_tokens for t in MARKUP_TOKENS)


def test_byte_tokenizer_save_then_autotokenizer_identical(
    tok: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.get_vocab() == tok.get_vocab()
    assert loaded.chat_template == tok.chat_template == CHAT_TEMPLATE
    assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert loaded.all_special_tokens == tok.all_special_tokens
    for text in TEXTS:
        assert loaded.encode(text) == tok.encode(text)
    messages = [{"role": "user", "content": "hi 🌍"}]
    assert loaded.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_chat_template_tool_conversation_renders_exact_string(
    tok: PreTrainedTokenizerBase,
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                },
                {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    rendered = tok.apply_chat_template(
        messages, tools=[ADD_TOOL], tokenize=False, add_generation_prompt=False
    )
    expected = (
        "<|im_start|>system\n"
        "Be brief.\n\n"
        "# Tools\n\n"
        "You can call these functions (JSON schemas, one per line):\n"
        '{"type": "function", "function": {"name": "add", "description": "Add two integers.", '
        '"parameters": {"type": "object", "properties": {"a": {"type": "integer"}, '
        '"b": {"type": "integer"}}, "required": ["a", "b"]}}}\n'
        "\n"
        "To call a function, answer with one line per call in exactly this form:\n"
        '<tool_call>{"name": "<function name>", "arguments": {<JSON arguments>}}</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n2+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n<tool_response>5</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n"
    )
    assert rendered == expected


def test_chat_template_text_and_tool_call_separated_by_newline(
    tok: PreTrainedTokenizerBase,
) -> None:
    message = {
        "role": "assistant",
        "content": "Let me add.",
        "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
    }
    rendered = tok.apply_chat_template([message], tokenize=False)
    assert rendered == (
        "<|im_start|>assistant\nLet me add.\n"
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>\n'
    )


def test_chat_template_system_without_tools_renders_plain_system_turn(
    tok: PreTrainedTokenizerBase,
) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_tools_without_system_message_open_system_turn(
    tok: PreTrainedTokenizerBase,
) -> None:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "U"}], tools=[ADD_TOOL], tokenize=False
    )
    assert rendered.startswith("<|im_start|>system\n# Tools\n\n")
    assert rendered.endswith("</tool_call><|im_end|>\n<|im_start|>user\nU<|im_end|>\n")


@pytest.mark.parametrize(
    ("kwargs", "suffix"),
    [
        ({}, "<|im_start|>assistant\n"),
        ({"enable_thinking": True}, "<|im_start|>assistant\n"),
        ({"enable_thinking": False}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ],
)
def test_chat_template_enable_thinking_false_appends_empty_think_block(
    tok: PreTrainedTokenizerBase, kwargs: dict[str, bool], suffix: str
) -> None:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "U"}], tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert rendered == "<|im_start|>user\nU<|im_end|>\n" + suffix


def test_chat_template_no_generation_prompt_ends_after_last_turn(
    tok: PreTrainedTokenizerBase,
) -> None:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "U"}], tokenize=False, enable_thinking=False
    )
    assert rendered == "<|im_start|>user\nU<|im_end|>\n"


def test_chat_template_reasoning_and_content_parts_rendered(
    tok: PreTrainedTokenizerBase,
) -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok", "reasoning_content": "think"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert rendered == (
        "<|im_start|>user\nab<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthink\n</think>\n\nok<|im_end|>\n"
    )


def test_compact_template_renders_each_tool_as_one_short_line() -> None:
    tok = build_byte_tokenizer("chatml-compact")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    text = tok.apply_chat_template(messages, tools=[ADD_TOOL], tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n\ntools: add(a: integer, b: integer)<|im_end|>\n"
        "<|im_start|>user\n2+3?<|im_end|>\n"
    )
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}],
    }
    full = tok.apply_chat_template([*messages, call], tools=[ADD_TOOL], tokenize=False)
    default = build_byte_tokenizer().apply_chat_template(
        [*messages, call], tools=[ADD_TOOL], tokenize=False
    )
    # calls and everything after the system turn are written exactly as by the default template
    tail = '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    assert tail in full and tail in default
    assert full.split("<|im_end|>\n", 1)[1] == default.split("<|im_end|>\n", 1)[1]


def test_build_byte_tokenizer_unknown_template_raises_listing_known() -> None:
    with pytest.raises(ValueError, match="unknown chat template 'fancy'.*chatml, chatml-compact"):
        build_byte_tokenizer("fancy")

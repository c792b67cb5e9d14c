"""Prompt rendering, SFT encoding and tool-call parsing."""

from __future__ import annotations

import logging

import pytest
from transformers import PreTrainedTokenizerBase

from areno_core import log
from areno_core.errors import DatasetError
from areno_core.models.chat import (
    encode_prompt,
    encode_sft_example,
    parse_tool_calls,
    render_prompt,
    supports_enable_thinking,
)
from areno_core.models.tokenizer import build_byte_tokenizer
from areno_core.types import PromptItem

IM_START, IM_END, NL = 257, 258, 10
# A template without an enable_thinking switch.
PLAIN_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def b(text: str) -> list[int]:
    """Byte-tokenizer ids of plain text (ids equal UTF-8 bytes)."""
    return list(text.encode("utf-8"))


@pytest.fixture
def tok() -> PreTrainedTokenizerBase:
    return build_byte_tokenizer()


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log, "_WARNED", set())


def test_render_prompt_plain_text_returned_unchanged(tok: PreTrainedTokenizerBase) -> None:
    assert render_prompt(tok, "2+2=") == "2+2="
    assert encode_prompt(tok, "2+2=") == b("2+2=")


def test_render_prompt_plain_text_with_chat_template_wraps_as_user(
    tok: PreTrainedTokenizerBase,
) -> None:
    rendered = render_prompt(tok, "2+2=", use_chat_template=True)
    assert rendered == "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"


def test_encode_prompt_prompt_item_messages_use_template(tok: PreTrainedTokenizerBase) -> None:
    item = PromptItem(index=0, row={}, messages=({"role": "user", "content": "hi"},))
    ids = encode_prompt(tok, item)
    assert ids == [IM_START, *b("user\nhi"), IM_END, NL, IM_START, *b("assistant\n")]


def test_render_prompt_tools_rendered_into_system_turn(tok: PreTrainedTokenizerBase) -> None:
    tools = [{"type": "function", "function": {"name": "move", "parameters": {}}}]
    rendered = render_prompt(tok, [{"role": "user", "content": "go"}], tools=tools)
    assert rendered.startswith("<|im_start|>system\n# Tools")
    assert '{"type": "function", "function": {"name": "move", "parameters": {}}}\n' in rendered


def test_render_prompt_disable_thinking_appends_empty_think_block(
    tok: PreTrainedTokenizerBase,
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert supports_enable_thinking(tok)
    assert render_prompt(tok, messages, disable_thinking=True).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render_prompt(tok, messages).endswith("<|im_start|>assistant\n")


def test_render_prompt_disable_thinking_without_switch_falls_back(
    tok: PreTrainedTokenizerBase,
) -> None:
    tok.chat_template = PLAIN_TEMPLATE
    assert not supports_enable_thinking(tok)
    rendered = render_prompt(tok, [{"role": "user", "content": "hi"}], disable_thinking=True)
    assert rendered == "[user]hi\n[assistant]"


def test_render_prompt_chat_row_without_template_warns_once(
    tok: PreTrainedTokenizerBase,
    caplog: pytest.LogCaptureFixture,
    fresh_warnings: None,
) -> None:
    tok.chat_template = None
    messages = [{"role": "user", "content": "hi"}]
    with caplog.at_level(logging.WARNING, logger="areno"):
        assert render_prompt(tok, "plain") == "plain"
        assert not caplog.records  # plain prompts need no template
        first = render_prompt(tok, messages)
        render_prompt(tok, messages)
    assert first == "user: hi\nassistant: "
    warnings = [r for r in caplog.records if "no chat template" in r.getMessage()]
    assert len(warnings) == 1


# A response that already ends with the EOS token does not get a second one.
@pytest.mark.parametrize("response", ["Yo", "Yo<|im_end|>"], ids=["plain", "ends-with-eos"])
def test_encode_sft_example_plain_text_masks_response_and_one_eos(
    tok: PreTrainedTokenizerBase, response: str
) -> None:
    ids, mask = encode_sft_example(tok, "Hi", response)
    assert ids == [72, 105, 89, 111, IM_END]
    assert mask == [0, 0, 1, 1, 1]


def test_encode_sft_example_chat_masks_hand_checked(tok: PreTrainedTokenizerBase) -> None:
    ids, mask = encode_sft_example(tok, [{"role": "user", "content": "Hi"}], "Yo")
    prompt = [IM_START, *b("user\nHi"), IM_END, NL, IM_START, *b("assistant\n")]
    assert ids == [*prompt, *b("Yo"), IM_END]
    assert mask == [0] * len(prompt) + [1, 1, 1]


def test_encode_sft_example_plain_prompt_chat_template_flag_wraps_both(
    tok: PreTrainedTokenizerBase,
) -> None:
    flagged = encode_sft_example(tok, "Hi", "Yo", use_chat_template=True)
    explicit = encode_sft_example(tok, [{"role": "user", "content": "Hi"}], "Yo")
    assert flagged == explicit


def test_encode_sft_example_disable_thinking_keeps_think_block_in_prompt(
    tok: PreTrainedTokenizerBase,
) -> None:
    ids, mask = encode_sft_example(
        tok, [{"role": "user", "content": "Hi"}], "Yo", disable_thinking=True
    )
    targets = [i for i, m in zip(ids, mask, strict=True) if m]
    prompt = [i for i, m in zip(ids, mask, strict=True) if not m]
    assert targets == [*b("Yo"), IM_END]
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_encode_sft_example_tool_call_response_targets_call_and_end(
    tok: PreTrainedTokenizerBase,
) -> None:
    response = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1}}}],
    }
    ids, mask = encode_sft_example(tok, "Add.", [response])
    targets = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert targets == '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><|im_end|>'
    assert mask[-1] == 1 and ids[-1] == IM_END


def test_encode_sft_example_template_without_eot_appends_eos(
    tok: PreTrainedTokenizerBase,
) -> None:
    tok.chat_template = PLAIN_TEMPLATE
    ids, mask = encode_sft_example(tok, [{"role": "user", "content": "Hi"}], "Yo")
    assert ids == [*b("[user]Hi\n[assistant]"), *b("Yo\n"), IM_END]
    assert mask == [0] * len(b("[user]Hi\n[assistant]")) + [1, 1, 1, 1]


@pytest.mark.parametrize(
    "response",
    [
        {"role": "user", "content": "x"},
        [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
    ],
)
def test_encode_sft_example_bad_response_raises(
    tok: PreTrainedTokenizerBase, response: object
) -> None:
    with pytest.raises(DatasetError):
        encode_sft_example(tok, "Hi", response)  # type: ignore[arg-type]


def test_parse_tool_calls_valid_blocks_extracted_malformed_kept() -> None:
    text = (
        "Thinking done.\n"
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
        '<tool_call>{"name": "mul", "arguments": "{\\"b\\": 2}"}</tool_call>\n'
        "<tool_call>not json</tool_call>"
    )
    content, calls = parse_tool_calls(text)
    assert calls == [
        {"name": "add", "arguments": {"a": 1}},
        {"name": "mul", "arguments": {"b": 2}},
    ]
    assert content == "Thinking done.\n\n\n<tool_call>not json</tool_call>"


def test_parse_tool_calls_roundtrips_template_rendering(tok: PreTrainedTokenizerBase) -> None:
    call = {"name": "move", "arguments": {"dx": -1, "label": "ü"}}
    rendered = tok.apply_chat_template(
        [{"role": "assistant", "content": "ok", "tool_calls": [{"function": call}]}],
        tokenize=False,
    )
    body = rendered.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    assert parse_tool_calls(body) == ("ok", [call])

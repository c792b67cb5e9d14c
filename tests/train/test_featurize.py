"""SFT rows become token trajectories with the row's tools in the prompt."""

from __future__ import annotations

from areno_core.models.chat import encode_prompt
from areno_core.models.tokenizer import build_byte_tokenizer
from areno_core.train.featurize import sft_trajectories

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}


def test_sft_row_with_tools_renders_them_in_the_prompt_and_trains_the_call() -> None:
    tok = build_byte_tokenizer()
    prompt = [{"role": "user", "content": "1+1?"}]
    rows = [
        {"prompt": prompt, "response": [{"role": "assistant", "content": "", "tool_calls": [CALL]}],
         "tools": [TOOL]},
        {"prompt": prompt, "response": "2"},
    ]  # fmt: skip
    (with_tools, without), stats = sft_trajectories(
        rows, tok, max_prompt_tokens=4096, max_new_tokens=256
    )
    assert stats.rows == 2
    p = with_tools.prompt_len
    assert with_tools.input_ids[:p] == encode_prompt(tok, prompt, tools=[TOOL])
    assert "# Tools" in tok.decode(with_tools.input_ids[:p])
    assert tok.decode(with_tools.input_ids[p:]) == (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><|im_end|>'
    )
    assert with_tools.loss_mask == [0] * p + [1] * (len(with_tools.input_ids) - p)
    assert without.input_ids[: without.prompt_len] == encode_prompt(tok, prompt)

"""Token ids and text for the agent endpoint: the bytes a token stands for (so streamed text
never splits a character), the longest text one token can decode to, the ``top_logprobs`` of a
choice, and the forced prefix that makes the policy call a named tool."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from areno_core.models.chat import apply_chat_template
from areno_core.models.tokenizer import byte_to_unicode

# The arguments of the probe call whose rendering shows where a tool call's arguments start.
_PROBE_ARGUMENTS = '{"areno_probe": 1}'


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for (its vocabulary strings and
    added tokens), so ``max_prompt_tokens * longest_token_chars`` characters of text surely
    tokenise to more than ``max_prompt_tokens`` tokens. Byte-level vocabularies spell one
    byte per character, so this bounds UTF-8 bytes and characters alike."""
    vocab = tokenizer.get_vocab()
    return max(1, max((len(token) for token in vocab), default=1))


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """The bytes one token stands for: exact for byte-level vocabularies (GPT-2 style, as the
    byte tokenizer and Qwen use), else the UTF-8 of its decoded text."""
    piece = tokenizer.convert_ids_to_tokens(int(token))
    table = byte_decoder()
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    if isinstance(piece, str) and int(token) not in added and all(ch in table for ch in piece):
        return bytes(table[ch] for ch in piece)
    return str(tokenizer.decode([int(token)])).encode("utf-8")


@functools.cache
def byte_decoder() -> dict[str, int]:

    return {char: byte for byte, char in byte_to_unicode().items()}


def top_logprobs(
    model: Any, prompt: list[int], tokens: list[int], k: int, temperature: float
) -> list[list[tuple[int, float]]]:
    """The ``k`` most likely tokens and their log-probabilities at every completion position,
    from one forward pass of ``model`` (``log_softmax(logits / temperature)``)."""
    if not tokens:
        return []
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids, use_cache=False).logits[0]
    finally:
        model.train(was_training)
    start = len(prompt) - 1
    scores = (logits[start : start + len(tokens)].float() / temperature).log_softmax(-1)
    values, index = scores.topk(min(k, scores.shape[-1]), dim=-1)
    return [
        list(zip(row_i, row_v, strict=True))
        for row_i, row_v in zip(index.tolist(), values.tolist(), strict=True)
    ]


def forced_tool_prefix(
    tokenizer: Any, tools: Sequence[Mapping[str, Any]], name: str | None
) -> str | None:
    """The text the chat template writes at the start of an assistant turn that calls
    ``name`` (through ``"arguments": ``), or, with ``name`` None, up to the opening of the
    call object (``<tool_call>`` for Qwen-style templates). None when the template does not
    render a call in a form that can be cut this way."""
    tools = [dict(t) for t in tools]
    probe_name = name or tools[0]["function"]["name"]
    messages = [{"role": "user", "content": "x"}]
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_probe",
                "type": "function",
                "function": {"name": probe_name, "arguments": _PROBE_ARGUMENTS},
            }
        ],
    }
    try:
        header = apply_chat_template(tokenizer, messages, tools=tools, add_generation_prompt=True)
        turn = apply_chat_template(
            tokenizer, [*messages, call], tools=tools, add_generation_prompt=False
        )
    except Exception:
        return None
    if not turn.startswith(header):
        return None
    turn = turn[len(header) :]
    at_name = turn.find(json.dumps(probe_name))
    at_args = turn.find(_PROBE_ARGUMENTS)
    if at_name < 0 or at_args < at_name:
        return None
    if name is not None:
        return turn[:at_args]
    opening = turn.rfind("{", 0, at_name)
    prefix = turn[:opening] if opening >= 0 else ""
    return prefix if prefix.strip() else None

"""Turn dataset prompts into text and token ids the same way for rollout and training.

* :func:`render_prompt` / :func:`encode_prompt`: a plain-text prompt is used as is (or, with
  ``use_chat_template=True``, wrapped as one user message); a message list goes through the
  tokenizer's chat template with the generation prompt.
* ``disable_thinking=True`` passes ``enable_thinking=False`` to templates that use that switch
  and makes the normal call for templates that do not.
* :func:`encode_sft_example`: prompt and response token ids plus a loss mask that is 1 exactly
  on the response (which always ends with an end-of-turn or eos token, so the model learns to
  stop).
* :func:`parse_tool_calls`: read back ``<tool_call>{...}</tool_call>`` blocks written in the
  form the areno chat template asks for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from areno_core.errors import DatasetError
from areno_core.log import get_logger, warn_once
from areno_core.types import PromptItem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = get_logger(__name__)

Message = Mapping[str, Any]
PromptInput = PromptItem | str | Sequence[Message]

# End-of-turn markers of common chat formats, most specific first; eos is the last resort.
END_OF_TURN_TOKENS: tuple[str, ...] = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def supports_enable_thinking(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template reads an ``enable_thinking`` variable."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default") or " ".join(str(t) for t in template.values())
    return isinstance(template, str) and "enable_thinking" in template


def end_of_turn_token(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The token that closes an assistant turn: a known chat marker in the vocab, else eos."""
    vocab = tokenizer.get_vocab()
    for token in END_OF_TURN_TOKENS:
        if token in vocab:
            return token
    return tokenizer.eos_token


def _as_messages(value: Sequence[Message]) -> list[dict[str, Any]]:
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or "role" not in message:
            raise DatasetError(f"chat message {i} must be a mapping with a 'role', got {message!r}")
        messages.append(dict(message))
    return messages


def _split_input(value: PromptInput) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(text, None) for a plain-text prompt, (None, messages) for a chat prompt."""
    if isinstance(value, PromptItem):
        if value.messages is not None:
            return None, _as_messages(value.messages)
        return value.prompt, None
    if isinstance(value, str):
        return value, None
    if isinstance(value, Sequence):
        return None, _as_messages(value)
    raise DatasetError(f"a prompt must be a string or a list of chat messages, got {value!r}")


def _plain_chat(messages: Sequence[Message], add_generation_prompt: bool) -> str:
    """Fallback rendering for tokenizers without a chat template: ``role: content`` lines."""
    lines = [f"{m['role']}: {_message_text(m)}\n" for m in messages]
    if add_generation_prompt:
        lines.append("assistant: ")
    return "".join(lines)


def _message_text(message: Message) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p if isinstance(p, str) else p.get("text", "") for p in content]
        return "".join(str(p) for p in parts)
    return str(content)


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    disable_thinking: bool = False,
) -> str:
    """Render ``messages`` with the tokenizer's chat template (text, not ids).

    Without a template the messages are rendered as ``role: content`` lines, with a one-time
    warning.
    """
    if not has_chat_template(tokenizer):
        warn_once(
            logger,
            f"no-chat-template:{tokenizer.name_or_path}",
            "tokenizer %r has no chat template; chat rows are rendered as 'role: content' "
            "lines (tools are not shown). Use plain-text prompts or a tokenizer with a template.",
            tokenizer.name_or_path,
        )
        return _plain_chat(messages, add_generation_prompt)
    kwargs: dict[str, Any] = {}
    if disable_thinking:
        if supports_enable_thinking(tokenizer):
            kwargs["enable_thinking"] = False
        else:
            warn_once(
                logger,
                f"no-thinking-switch:{tokenizer.name_or_path}",
                "--disable-thinking: the chat template of %r has no enable_thinking switch; "
                "rendering it normally",
                tokenizer.name_or_path,
            )
    rendered = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tools=[dict(t) for t in tools] if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **kwargs,
    )
    if not isinstance(rendered, str):
        raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, not str")
    return rendered


def _render(
    tokenizer: PreTrainedTokenizerBase,
    item_or_messages: PromptInput,
    *,
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    disable_thinking: bool,
    use_chat_template: bool,
) -> tuple[str, bool]:
    """The prompt text and whether it came from a chat rendering."""
    text, messages = _split_input(item_or_messages)
    if messages is None:
        assert text is not None
        if not (use_chat_template and has_chat_template(tokenizer)):
            return text, False
        messages = [{"role": "user", "content": text}]
    rendered = apply_chat_template(
        tokenizer,
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        disable_thinking=disable_thinking,
    )
    return rendered, True


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    item_or_messages: PromptInput,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    disable_thinking: bool = False,
    use_chat_template: bool = False,
) -> str:
    """The text a prompt (plain text, message list, or :class:`PromptItem`) is rendered to.

    Plain text is returned unchanged unless ``use_chat_template`` is set and the tokenizer has
    a template, in which case it becomes a single user message.
    """
    text, _ = _render(
        tokenizer,
        item_or_messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        disable_thinking=disable_thinking,
        use_chat_template=use_chat_template,
    )
    return text


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    item_or_messages: PromptInput,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    disable_thinking: bool = False,
    use_chat_template: bool = False,
) -> list[int]:
    """Token ids of :func:`render_prompt`'s text.

    Plain text is encoded with the tokenizer's own special tokens (e.g. a BOS); chat-rendered
    text is encoded without them, since templates write those tokens themselves.
    """
    text, from_chat = _render(
        tokenizer,
        item_or_messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        disable_thinking=disable_thinking,
        use_chat_template=use_chat_template,
    )
    return list(tokenizer.encode(text, add_special_tokens=not from_chat))


def _response_message(response: str | Message | Sequence[Message]) -> dict[str, Any] | None:
    """None for a plain-text response, else the single assistant message it holds."""
    if isinstance(response, str):
        return None
    if isinstance(response, Mapping):
        message = dict(response)
    elif isinstance(response, Sequence) and len(response) == 1:
        message = _as_messages(response)[0]
    else:
        raise DatasetError(
            "a trained reply (an sft response, a dpo chosen or rejected) must be a string, one "
            f"assistant message, or a list holding one assistant message; got {_short(response)}"
        )
    if message.get("role") != "assistant":
        raise DatasetError(
            f"a trained reply message must have role 'assistant', got {_short(message)}"
        )
    return message


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _chat_response_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    response: dict[str, Any],
    prompt_text: str,
    *,
    tools: Sequence[Mapping[str, Any]] | None,
    disable_thinking: bool,
) -> str:
    """The text the template writes for ``response`` after the generation prompt."""
    eot = end_of_turn_token(tokenizer)
    if not has_chat_template(tokenizer):
        return _message_text(response)
    full = apply_chat_template(
        tokenizer,
        [*messages, response],
        tools=tools,
        add_generation_prompt=False,
        disable_thinking=disable_thinking,
    )
    body: str | None = None
    if full.startswith(prompt_text):
        body = full[len(prompt_text) :]
    elif disable_thinking:
        # Templates that add an empty think block only to the generation prompt: the response
        # follows the plain assistant header in the full rendering.
        header = apply_chat_template(
            tokenizer, messages, tools=tools, add_generation_prompt=True, disable_thinking=False
        )
        if full.startswith(header):
            body = full[len(header) :]
    if body is None:
        warn_once(
            logger,
            f"sft-template-prefix:{tokenizer.name_or_path}",
            "the chat template of %r does not render a conversation as prompt + response; "
            "SFT targets are the assistant content plus %r",
            tokenizer.name_or_path,
            eot,
        )
        body = _message_text(response) + (eot or "")
    stripped = body.rstrip()
    if eot and stripped.endswith(eot):
        body = stripped  # drop the newline a template writes between turns
    return body


def encode_sft_example(
    tokenizer: PreTrainedTokenizerBase,
    prompt: PromptInput,
    response: str | Message | Sequence[Message],
    *,
    disable_thinking: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    use_chat_template: bool = False,
) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` for one supervised example; mask 1 marks trainable targets.

    Plain-text prompt and response: prompt ids (mask 0) then response ids (mask 1) plus an eos
    token when the response does not already end with one. When either side is a chat value
    (or ``use_chat_template`` is set and the tokenizer has a template), the prompt is rendered
    with the generation prompt and the response is the assistant turn as the template writes
    it, ending with the end-of-turn token (``<|im_end|>``), so the model learns to stop.
    """
    prompt_text_in, prompt_messages = _split_input(prompt)
    response_message = _response_message(response)
    chat = (
        prompt_messages is not None
        or response_message is not None
        or (use_chat_template and has_chat_template(tokenizer))
    )
    eos_id = tokenizer.eos_token_id
    if not chat:
        assert prompt_text_in is not None and isinstance(response, str)
        prompt_ids = list(tokenizer.encode(prompt_text_in, add_special_tokens=True))
        response_ids = list(tokenizer.encode(response, add_special_tokens=False))
        stop_ids = {eos_id}
    else:
        if prompt_messages is None:
            prompt_messages = [{"role": "user", "content": prompt_text_in}]
        if response_message is None:
            response_message = {"role": "assistant", "content": response}
        prompt_text = apply_chat_template(
            tokenizer,
            prompt_messages,
            tools=tools,
            add_generation_prompt=True,
            disable_thinking=disable_thinking,
        )
        response_text = _chat_response_text(
            tokenizer,
            prompt_messages,
            response_message,
            prompt_text,
            tools=tools,
            disable_thinking=disable_thinking,
        )
        prompt_ids = list(tokenizer.encode(prompt_text, add_special_tokens=False))
        response_ids = list(tokenizer.encode(response_text, add_special_tokens=False))
        eot = end_of_turn_token(tokenizer)
        stop_ids = {eos_id, tokenizer.convert_tokens_to_ids(eot) if eot else None}
    if eos_id is not None and (not response_ids or response_ids[-1] not in stop_ids):
        response_ids.append(eos_id)
    input_ids = prompt_ids + response_ids
    loss_mask = [0] * len(prompt_ids) + [1] * len(response_ids)
    return input_ids, loss_mask


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split generated text into (content, tool calls).

    Each ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block whose body is a JSON
    object with a string ``name`` becomes ``{"name": ..., "arguments": {...}}`` (arguments given
    as a JSON string are decoded) and is removed from the content. Malformed blocks stay in
    the content, so nothing the model wrote is silently lost.
    """
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return match.group(0)
        arguments = body.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return match.group(0)
        if not isinstance(arguments, dict):
            return match.group(0)
        calls.append({"name": body["name"], "arguments": arguments})
        return ""

    content = _TOOL_CALL.sub(take, text)
    return content.strip() if calls else content, calls


__all__ = [
    "END_OF_TURN_TOKENS",
    "Message",
    "PromptInput",
    "apply_chat_template",
    "encode_prompt",
    "encode_sft_example",
    "end_of_turn_token",
    "has_chat_template",
    "parse_tool_calls",
    "render_prompt",
    "supports_enable_thinking",
]

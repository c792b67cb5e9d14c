"""A byte-level tokenizer with ChatML and tool-calling special tokens, built locally.

No model hub is needed: every UTF-8 string maps to its bytes (256 base tokens, no merges), so
any text round-trips exactly, and the chat/tool markers are single tokens. Pair it with a
``random:`` model (see :mod:`areno_core.models.scratch`) for from-scratch experiments::

    tok = build_byte_tokenizer()
    tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                            add_generation_prompt=True)
"""

from __future__ import annotations

from functools import cache

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
EOS_TOKEN = IM_END

# Control tokens: hidden by ``decode(..., skip_special_tokens=True)``.
CONTROL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END)
# Markup tokens: single ids, but kept in decoded text so tool calls and thoughts can be parsed.
MARKUP_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
SPECIAL_TOKENS: tuple[str, ...] = CONTROL_TOKENS + MARKUP_TOKENS

NUM_BYTE_TOKENS = 256

# ChatML with tools. Rendered turns:
#   <|im_start|>{role}\n{content}<|im_end|>\n
# Tools go into the system turn as one JSON schema per line; assistant tool calls are rendered
# one per line as <tool_call>{"name": ..., "arguments": {...}}</tool_call>; tool results become a
# ``tool`` turn wrapped in <tool_response>...</tool_response>. ``enable_thinking=False`` appends
# an empty think block after the generation prompt.
CHAT_TEMPLATE = """\
{#- areno ChatML template (system / user / assistant / tool, tools, thinking switch) -#}
{%- macro render_text(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is mapping -%}
        {{- content.text if content.text is defined else '' -}}
    {%- elif content is iterable -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part is mapping and part.text is defined -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- elif content is not none and content is defined -%}
        {{- content | string -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_call(call) -%}
    {%- set fn = call.function if call.function is defined else call -%}
    {%- set args = fn.arguments if fn.arguments is defined else {} -%}
    {{- '<tool_call>{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
    {%- if args is string -%}
        {{- args -}}
    {%- else -%}
        {{- args | tojson -}}
    {%- endif -%}
    {{- '}</tool_call>' -}}
{%- endmacro -%}
{%- set ns = namespace(first=0, system='') -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.system = render_text(messages[0].content) -%}
    {%- set ns.first = 1 -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if ns.system -%}
        {{- ns.system + '\\n\\n' -}}
    {%- endif -%}
    @TOOLS@
    {{- '<|im_end|>\\n' -}}
{%- elif ns.first == 1 -%}
    {{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
    {%- if message.role == 'assistant' -%}
        {%- set text = render_text(message.content) -%}
        {{- '<|im_start|>assistant\\n' -}}
        {%- if message.reasoning_content is defined and message.reasoning_content -%}
            {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}
        {%- endif -%}
        {{- text -}}
        {%- if message.tool_calls is defined and message.tool_calls -%}
            {%- for call in message.tool_calls -%}
                {%- if text or not loop.first -%}
                    {{- '\\n' -}}
                {%- endif -%}
                {{- render_call(call) -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif message.role == 'tool' -%}
        {{- '<|im_start|>tool\\n<tool_response>' + render_text(message.content) -}}
        {{- '</tool_response><|im_end|>\\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\\n' -}}
        {{- render_text(message.content) + '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\\n\\n</think>\\n\\n' -}}
    {%- endif -%}
{%- endif -%}
"""
_FULL_TOOLS = """\
{{- '# Tools\\n\\nYou can call these functions (JSON schemas, one per line):\\n' -}}
    {%- for tool in tools -%}
        {{- (tool | tojson) + '\\n' -}}
    {%- endfor -%}
    {{- '\\nTo call a function, answer with one line per call in exactly this form:\\n' -}}
    {{- '<tool_call>{"name": "<function name>", "arguments": {<JSON arguments>}}</tool_call>' -}}"""
# One short line per tool, ``name(arg: type, ...)``: no descriptions, schemas or instructions.
# For small models trained from scratch on short prompts (the byte tokenizer spends a token per
# character); the calls themselves are written and parsed exactly as with the full template.
_COMPACT_TOOLS = """\
{{- 'tools:' -}}
    {%- for tool in tools -%}
        {%- set fn = tool.function if tool.function is defined else tool -%}
        {%- set params = fn.parameters if fn.parameters is defined and fn.parameters else {} -%}
        {%- set props = params.properties if params.properties is defined else {} -%}
        {{- ' ' + fn.name + '(' -}}
        {%- for name, spec in props.items() -%}
            {{- name + (': ' + spec.type if spec is mapping and spec.type is string else '') -}}
            {%- if not loop.last -%}{{- ', ' -}}{%- endif -%}
        {%- endfor -%}
        {{- ')' -}}
    {%- endfor -%}"""
_TEMPLATE = CHAT_TEMPLATE
CHAT_TEMPLATE = _TEMPLATE.replace("@TOOLS@", _FULL_TOOLS)
COMPACT_CHAT_TEMPLATE = _TEMPLATE.replace("@TOOLS@", _COMPACT_TOOLS)
CHAT_TEMPLATES: dict[str, str] = {"chatml": CHAT_TEMPLATE, "chatml-compact": COMPACT_CHAT_TEMPLATE}
"""Chat templates of the byte tokenizer by name: ``chatml`` (the default) and
``chatml-compact`` (tools as one short line each)."""


@cache
def byte_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable character table used by byte-level BPE.

    Printable Latin-1 bytes stand for themselves; the remaining 68 bytes (controls, space,
    a few Latin-1 gaps) are moved to code points 256 and up, in byte order.
    """
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    table: dict[int, str] = {}
    shifted = 0
    for byte in range(NUM_BYTE_TOKENS):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(NUM_BYTE_TOKENS + shifted)
            shifted += 1
    return table


def build_byte_tokenizer(chat_template: str = "chatml") -> PreTrainedTokenizerFast:
    """Build the areno byte-level tokenizer.

    Ids 0-255 are the raw bytes (id == byte value); the special tokens follow in the order of
    :data:`SPECIAL_TOKENS` (``<|endoftext|>`` = 256 is the pad token, ``<|im_end|>`` = 258 the
    eos token). There is no BOS token and no unknown token (every byte is in the vocabulary).
    The chat template is one of :data:`CHAT_TEMPLATES` (the ChatML :data:`CHAT_TEMPLATE` by
    default).
    """
    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(
            f"unknown chat template {chat_template!r}; known: {', '.join(CHAT_TEMPLATES)}"
        )
    vocab = {char: byte for byte, char in byte_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    # No regex split: with no merges the pieces would not change, and skipping it is faster.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATES[chat_template],
        padding_side="right",
    )


__all__ = [
    "CHAT_TEMPLATE",
    "CHAT_TEMPLATES",
    "COMPACT_CHAT_TEMPLATE",
    "CONTROL_TOKENS",
    "EOS_TOKEN",
    "IM_END",
    "IM_START",
    "MARKUP_TOKENS",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_byte_tokenizer",
    "byte_to_unicode",
]

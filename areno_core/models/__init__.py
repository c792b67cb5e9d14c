"""Models and tokenizers: loading by reference, from-scratch models, chat rendering.

A model reference is a ``random:`` spec (``random:qwen3-tiny``), a local checkpoint directory,
or a Hugging Face model id. See docs/models.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areno_core.lazy import lazy_attributes

# Where each name lives. The package imports a module when one of its names is first asked
# for (PEP 562), so that ``areno_core.models.chat`` or ``.lora`` can be imported without the
# model-loading stack of transformers (seconds of imports a command checking its options
# does not need).
_HOME = {
    "apply_chat_template": "chat",
    "encode_prompt": "chat",
    "encode_sft_example": "chat",
    "end_of_turn_token": "chat",
    "has_chat_template": "chat",
    "parse_tool_calls": "chat",
    "render_prompt": "chat",
    "supports_enable_thinking": "chat",
    "ValueModel": "loading",
    "ensure_pad_token": "loading",
    "hub_reachable": "loading",
    "load_model": "loading",
    "load_model_and_tokenizer": "loading",
    "load_tokenizer": "loading",
    "load_value_model": "loading",
    "resolve_dtype": "loading",
    "PRESETS": "scratch",
    "RandomModelSpec": "scratch",
    "build_random_config": "scratch",
    "build_random_model": "scratch",
    "count_parameters": "scratch",
    "is_random_ref": "scratch",
    "parse_random_ref": "scratch",
    "CHAT_TEMPLATE": "tokenizer",
    "SPECIAL_TOKENS": "tokenizer",
    "build_byte_tokenizer": "tokenizer",
}


__getattr__ = lazy_attributes(__name__, {n: f"{__name__}.{m}" for n, m in _HOME.items()})

if TYPE_CHECKING:
    from areno_core.models.chat import (
        apply_chat_template,
        encode_prompt,
        encode_sft_example,
        end_of_turn_token,
        has_chat_template,
        parse_tool_calls,
        render_prompt,
        supports_enable_thinking,
    )
    from areno_core.models.loading import (
        ValueModel,
        ensure_pad_token,
        hub_reachable,
        load_model,
        load_model_and_tokenizer,
        load_tokenizer,
        load_value_model,
        resolve_dtype,
    )
    from areno_core.models.scratch import (
        PRESETS,
        RandomModelSpec,
        build_random_config,
        build_random_model,
        count_parameters,
        is_random_ref,
        parse_random_ref,
    )
    from areno_core.models.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, build_byte_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "PRESETS",
    "SPECIAL_TOKENS",
    "RandomModelSpec",
    "ValueModel",
    "apply_chat_template",
    "build_byte_tokenizer",
    "build_random_config",
    "build_random_model",
    "count_parameters",
    "encode_prompt",
    "encode_sft_example",
    "end_of_turn_token",
    "ensure_pad_token",
    "has_chat_template",
    "hub_reachable",
    "is_random_ref",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "load_value_model",
    "parse_random_ref",
    "parse_tool_calls",
    "render_prompt",
    "resolve_dtype",
    "supports_enable_thinking",
]

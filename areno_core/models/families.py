"""The open model families areno is tested on, their tiny test shapes and attention windows.

Each :class:`ModelFamily` names a real ``transformers`` causal-LM class and a tiny shape of it
(the byte tokenizer's 272-token vocabulary, 64 hidden units, 2-3 layers) that keeps the
family's distinctive parts: sliding-window layers, soft-capping, query scaling, per-layer rope
bases, mixtures of experts, attention sinks. ``tests/models/test_families.py`` and
``tests/test_e2e_families.py`` run every path on each of them, and
:func:`areno_core.family_paths.family_table` writes the table in docs/models.md from the code
that decides each path (so the table cannot drift from it).

Attention windows: :func:`attention_windows` says, per layer, how many keys back a query may
look (None: all of them), from ``config.layer_types`` when the config has them (Gemma 2/3,
GPT-OSS, Qwen2/3) and otherwise from ``config.sliding_window`` applied to every layer (Mistral,
Phi-3). The native rollout engine keeps every key and lets each layer's mask apply its window;
training forwards that reuse a prompt's keys across rows (shared prompts) are only used when
no layer has a window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import transformers
from torch import nn

from areno_core.errors import ConfigError
from areno_core.models.tokenizer import build_byte_tokenizer

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
# Layer kinds whose keys the native engine keeps in full (a window is a mask over them).
SUPPORTED_LAYER_TYPES: tuple[str, ...] = (FULL_ATTENTION, SLIDING_ATTENTION)

# The tiny shape every family starts from (the byte tokenizer pads its vocabulary to 272).
_BASE: Mapping[str, Any] = {
    "vocab_size": 272,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
}
# The byte tokenizer's <|im_end|> and <|endoftext|> (see areno_core.models.tokenizer).
_BYTE_EOS, _BYTE_PAD = 258, 256
# Short enough that the tests' prompts plus completions outgrow it.
TINY_WINDOW = 8


@attrs.frozen
class ModelFamily:
    """One model family: the transformers classes, the real checkpoints its tiny shape stands
    for, and the config fields of that shape (on top of a 64-wide, 2-layer base)."""

    name: str
    config_cls: str
    causal_lm_cls: str
    stands_for: str
    shape: Mapping[str, Any] = attrs.field(factory=dict)
    notes: str = ""

    def config(self, tokenizer: Any = None) -> Any:
        """The tiny config, with the special token ids of ``tokenizer`` (default: the byte
        tokenizer's: eos 258, pad and bos 256)."""
        kwargs = {**_BASE, **self.shape}
        eos, pad = (
            (_BYTE_EOS, _BYTE_PAD)
            if tokenizer is None
            else (
                tokenizer.eos_token_id,
                tokenizer.pad_token_id,
            )
        )
        kwargs.update(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad)
        return getattr(transformers, self.config_cls)(**kwargs)

    def build(self, tokenizer: Any = None, *, seed: int = 0) -> nn.Module:
        """A randomly initialised tiny model (deterministic for ``seed``; the global torch
        random state is left as it was)."""
        config = self.config(tokenizer)
        cls = getattr(transformers, self.causal_lm_cls)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = cls(config)
        if tokenizer is not None:
            model.generation_config.eos_token_id = tokenizer.eos_token_id
            model.generation_config.pad_token_id = tokenizer.pad_token_id
        return model.eval()

    def save(self, directory: str | Path, *, seed: int = 0) -> Path:
        """Write a tiny random checkpoint of this family with the byte tokenizer to
        ``directory`` (what ``--ckpt DIR`` reads); returns the directory."""

        tokenizer = build_byte_tokenizer()
        model = self.build(tokenizer, seed=seed)
        path = Path(directory)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return path


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily(
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        "Llama 3.x (1B-70B), SmolLM2",
    ),
    ModelFamily(
        "qwen2",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        "Qwen2 / Qwen2.5 (0.5B-72B), DeepSeek-R1-Distill-Qwen",
        notes="query/key/value biases",
    ),
    ModelFamily(
        "qwen3",
        "Qwen3Config",
        "Qwen3ForCausalLM",
        "Qwen3 dense (0.6B-32B)",
        notes="per-head query/key RMSNorm",
    ),
    ModelFamily(
        "qwen3_moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        "Qwen3-30B-A3B, Qwen3-235B-A22B",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
        notes="4 experts, 2 per token",
    ),
    ModelFamily(
        "mistral",
        "MistralConfig",
        "MistralForCausalLM",
        "Mistral 7B v0.1 (sliding window), Mistral 7B v0.3, Ministral",
        {"sliding_window": TINY_WINDOW},
        notes="every layer slides over 8 tokens",
    ),
    ModelFamily(
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        "Gemma 2 (2B, 9B, 27B)",
        {
            "num_hidden_layers": 2,
            "sliding_window": TINY_WINDOW,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
        notes="local/global layers alternate, attention and final logits soft-capped (at 2 "
        "and 3 instead of 50 and 30, and a window of 8 tokens, so that both bind on random "
        "weights and short test sequences), queries scaled by 1/sqrt(24)",
    ),
    ModelFamily(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "Gemma 3 text (270M, 1B; the text tower of 4B-27B)",
        {
            "num_hidden_layers": 3,
            "layer_types": [SLIDING_ATTENTION, SLIDING_ATTENTION, FULL_ATTENTION],
            "sliding_window": TINY_WINDOW,
            "query_pre_attn_scalar": 24,
        },
        notes="two local layers (rope base 10k) per global one (rope base 1M), query/key "
        "RMSNorm, queries scaled by 1/sqrt(24), embeddings by sqrt(hidden); a window of 8 "
        "tokens so that it binds on short test sequences",
    ),
    ModelFamily(
        "phi3",
        "Phi3Config",
        "Phi3ForCausalLM",
        "Phi-3 / Phi-3.5 mini, Phi-4-mini",
        notes="fused qkv_proj and gate_up_proj (Phi-3-mini-4k's 2047-token window takes "
        "the path the Mistral row tests)",
    ),
    ModelFamily(
        "olmo2",
        "Olmo2Config",
        "Olmo2ForCausalLM",
        "OLMo 2 (1B-32B)",
        notes="norms after attention and MLP; query/key RMSNorm over all heads",
    ),
    ModelFamily(
        "gpt_oss",
        "GptOssConfig",
        "GptOssForCausalLM",
        "gpt-oss-20b, gpt-oss-120b",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": TINY_WINDOW,
            "layer_types": [SLIDING_ATTENTION, FULL_ATTENTION],
            # the real length, which its YaRN rope factor (32 x 4096) is computed against
            "max_position_embeddings": 131072,
        },
        notes="attention sinks, 4 experts, local/global layers",
    ),
)


def available_families() -> tuple[ModelFamily, ...]:
    """The families whose classes this ``transformers`` has."""
    return tuple(
        f
        for f in FAMILIES
        if hasattr(transformers, f.config_cls) and hasattr(transformers, f.causal_lm_cls)
    )


def family(name: str) -> ModelFamily:
    """The family called ``name``; :class:`ConfigError` naming the known ones otherwise."""
    for f in FAMILIES:
        if f.name == name:
            return f
    known = ", ".join(f.name for f in FAMILIES)
    raise ConfigError(f"unknown model family {name!r}; known families: {known}")


# -- attention windows ------------------------------------------------------------------------


def text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def attention_windows(config: Any) -> list[int | None]:
    """Per layer, the sliding window of its attention (None: full attention).

    ``layer_types`` decides when the config has it; otherwise ``sliding_window`` (when set)
    applies to every layer. A layer type other than full or sliding attention raises
    :class:`ConfigError` naming it.
    """
    text = text_config(config)
    layers = int(text.num_hidden_layers)
    window = getattr(text, "sliding_window", None)
    layer_types: Sequence[str] | None = getattr(text, "layer_types", None)
    if not layer_types:
        return [int(window) if window else None] * layers
    odd = sorted({t for t in layer_types if t not in SUPPORTED_LAYER_TYPES})
    if odd:
        raise ConfigError(
            f"{getattr(text, 'model_type', 'this model')} has layer types {odd}; areno "
            f"supports {', '.join(SUPPORTED_LAYER_TYPES)} layers"
        )
    if SLIDING_ATTENTION in layer_types and not window:
        raise ConfigError("the config has sliding_attention layers but no sliding_window")
    return [int(window) if t == SLIDING_ATTENTION else None for t in layer_types]


def has_sliding_window(config: Any) -> bool:
    """Whether any layer attends through a sliding window."""
    return any(w is not None for w in attention_windows(config))


__all__ = [
    "FAMILIES",
    "FULL_ATTENTION",
    "SLIDING_ATTENTION",
    "SUPPORTED_LAYER_TYPES",
    "TINY_WINDOW",
    "ModelFamily",
    "attention_windows",
    "available_families",
    "family",
    "has_sliding_window",
]

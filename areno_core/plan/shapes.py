"""The shape of a decoder-only model, as far as memory is concerned, and its parameter count.

A :class:`ModelShape` comes from a model reference (``random:qwen3-small``, a local checkpoint
directory or ``config.json``), from :data:`PUBLISHED` (the published configs of popular models,
so ``Qwen/Qwen3-8B`` needs no download), or from explicit sizes. Parameter counts follow the
layout shared by the Qwen2/Qwen3/Llama families (and Qwen3-MoE): tests check them against
the models transformers builds from the same configs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from areno_core.errors import ConfigError


@attrs.frozen
class ModelShape:
    """Sizes of a Qwen/Llama-style decoder (SwiGLU MLP, RMSNorm, grouped-query attention)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's queries and keys
    qkv_bias: bool = False  # Qwen2: biases on the query, key and value projections
    experts: int = 0  # 0: a dense MLP in every layer
    experts_per_token: int = 0
    expert_intermediate: int = 0
    family: str = "qwen3"
    name: str = "custom"

    def __attrs_post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model shape: {field} must be a positive integer, got {value}")
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"model shape: {self.heads} attention heads are not a multiple of "
                f"{self.kv_heads} key/value heads"
            )
        if self.experts and not (0 < self.experts_per_token <= self.experts):
            raise ConfigError(
                f"model shape: {self.experts_per_token} experts per token with {self.experts} "
                "experts; expected 1 to the number of experts"
            )
        if not self.experts and self.intermediate < 1:
            raise ConfigError(
                f"model shape: intermediate must be positive, got {self.intermediate}"
            )

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    # -- parameters --------------------------------------------------------------------------

    def attention_params(self) -> int:
        """One layer's attention: q, k, v, o projections (+ biases, + per-head norms)."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        count = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            count += q + 2 * kv
        if self.qk_norm:
            count += 2 * self.head_dim
        return count

    def mlp_params(self) -> int:
        """One layer's MLP: gate, up and down projections (every expert's, and the router)."""
        if self.experts:
            return self.experts * 3 * self.hidden * self.expert_intermediate + (
                self.hidden * self.experts
            )
        return 3 * self.hidden * self.intermediate

    def layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.hidden

    def embedding_params(self) -> int:
        """Input embeddings plus the output layer when it is not tied to them."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def total_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.hidden

    def tp_split_params(self) -> int:
        """Parameters that tensor parallelism splits: the decoder layers' projections."""
        return self.layers * (self.layer_params() - 2 * self.hidden - self._head_norms())

    def _head_norms(self) -> int:
        return 2 * self.head_dim if self.qk_norm else 0

    def lora_params(self, rank: int) -> int:
        """Adapter parameters of rank ``rank`` on every projection of every layer (areno's
        default targets for these families; experts' projections are not adapted)."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        attention = rank * ((h + q) + 2 * (h + kv) + (q + h))
        mlp = 0 if self.experts else rank * 3 * (h + self.intermediate)
        return self.layers * (attention + mlp)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token over every layer."""
        return 2 * self.layers * self.kv_width * dtype_bytes


# Published configs (each model's config.json on the Hugging Face hub) and the parameter
# counts on its model card, so that a plan for a hub id needs no download.
_QWEN3 = {"family": "qwen3", "qk_norm": True, "head_dim": 128, "vocab": 151936}
_QWEN25 = {"family": "qwen2", "qkv_bias": True}
_LLAMA3 = {"family": "llama", "vocab": 128256}
PUBLISHED: Mapping[str, Mapping[str, Any]] = {
    "Qwen/Qwen3-0.6B": {
        **_QWEN3, "layers": 28, "hidden": 1024, "heads": 16, "kv_heads": 8,
        "intermediate": 3072, "tied": True, "card_params": 0.6e9,
    },
    "Qwen/Qwen3-1.7B": {
        **_QWEN3, "layers": 28, "hidden": 2048, "heads": 16, "kv_heads": 8,
        "intermediate": 6144, "tied": True, "card_params": 1.7e9,
    },
    "Qwen/Qwen3-4B": {
        **_QWEN3, "layers": 36, "hidden": 2560, "heads": 32, "kv_heads": 8,
        "intermediate": 9728, "tied": True, "card_params": 4.0e9,
    },
    "Qwen/Qwen3-8B": {
        **_QWEN3, "layers": 36, "hidden": 4096, "heads": 32, "kv_heads": 8,
        "intermediate": 12288, "card_params": 8.2e9,
    },
    "Qwen/Qwen3-14B": {
        **_QWEN3, "layers": 40, "hidden": 5120, "heads": 40, "kv_heads": 8,
        "intermediate": 17408, "card_params": 14.8e9,
    },
    "Qwen/Qwen3-32B": {
        **_QWEN3, "layers": 64, "hidden": 5120, "heads": 64, "kv_heads": 8,
        "intermediate": 25600, "card_params": 32.8e9,
    },
    "Qwen/Qwen3-30B-A3B": {
        **_QWEN3, "family": "qwen3_moe", "layers": 48, "hidden": 2048, "heads": 32,
        "kv_heads": 4, "intermediate": 6144, "experts": 128, "experts_per_token": 8,
        "expert_intermediate": 768, "card_params": 30.5e9,
    },
    "Qwen/Qwen2.5-0.5B": {
        **_QWEN25, "layers": 24, "hidden": 896, "heads": 14, "kv_heads": 2, "head_dim": 64,
        "intermediate": 4864, "vocab": 151936, "tied": True, "card_params": 0.49e9,
    },
    "Qwen/Qwen2.5-1.5B": {
        **_QWEN25, "layers": 28, "hidden": 1536, "heads": 12, "kv_heads": 2, "head_dim": 128,
        "intermediate": 8960, "vocab": 151936, "tied": True, "card_params": 1.54e9,
    },
    "Qwen/Qwen2.5-7B": {
        **_QWEN25, "layers": 28, "hidden": 3584, "heads": 28, "kv_heads": 4, "head_dim": 128,
        "intermediate": 18944, "vocab": 152064, "card_params": 7.61e9,
    },
    "meta-llama/Llama-3.2-1B": {
        **_LLAMA3, "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "head_dim": 64,
        "intermediate": 8192, "tied": True, "card_params": 1.24e9,
    },
    "meta-llama/Llama-3.2-3B": {
        **_LLAMA3, "layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "head_dim": 128,
        "intermediate": 8192, "tied": True, "card_params": 3.21e9,
    },
    "meta-llama/Llama-3.1-8B": {
        **_LLAMA3, "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
        "intermediate": 14336, "card_params": 8.03e9,
    },
}  # fmt: skip
# Instruct/base variants share their model's shape.
_ALIASES = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.2-1B-Instruct": "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B-Instruct": "meta-llama/Llama-3.2-3B",
    "Qwen/Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-1.5B",
    "Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B",
}


def published_shape(ref: str) -> ModelShape | None:
    """The shape of a model in :data:`PUBLISHED` (case-insensitive id, ``-Base`` and
    ``-Instruct`` variants included), else None."""
    key = ref.strip().rstrip("/")
    folded = {k.lower(): k for k in (*PUBLISHED, *_ALIASES)}
    lowered = key.lower()
    for suffix in ("-base", ""):
        if lowered.endswith(suffix) and lowered[: len(lowered) - len(suffix)] in folded:
            name = folded[lowered[: len(lowered) - len(suffix)]]
            name = _ALIASES.get(name, name)
            fields = {k: v for k, v in PUBLISHED[name].items() if k != "card_params"}
            return ModelShape(name=name, **fields)
    return None


def shape_from_config(config: Any, *, name: str = "custom") -> ModelShape:
    """The shape of a transformers config (its text config for multimodal models)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    family = str(getattr(text, "model_type", "unknown"))
    heads = int(text.num_attention_heads)
    hidden = int(text.hidden_size)
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    experts = int(getattr(text, "num_experts", 0) or getattr(text, "num_local_experts", 0) or 0)
    return ModelShape(
        layers=int(text.num_hidden_layers),
        hidden=hidden,
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        intermediate=int(getattr(text, "intermediate_size", 0) or 0),
        vocab=int(text.vocab_size),
        tied=bool(getattr(text, "tie_word_embeddings", False)),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        qkv_bias=bool(getattr(text, "attention_bias", False)) or family == "qwen2",
        experts=experts,
        experts_per_token=int(getattr(text, "num_experts_per_tok", 0) or 0) if experts else 0,
        expert_intermediate=int(getattr(text, "moe_intermediate_size", 0) or 0) if experts else 0,
        family=family,
        name=name,
    )


def resolve_shape(ref: str) -> ModelShape:
    """The shape of a model reference: a published model by hub id, a ``random:`` model, or a
    local checkpoint directory or ``config.json``. Reads no weights and uses no network."""
    known = published_shape(ref)
    if known is not None:
        return known
    # Both load transformers' model classes: only for the shapes that need them, so that
    # ``areno plan`` and the commands beside it start without them.
    from transformers import AutoConfig  # heavy: transformers, for a checkpoint's config

    from areno_core.models.scratch import build_random_config, is_random_ref  # heavy, as above

    if is_random_ref(ref):
        return shape_from_config(build_random_config(ref), name=ref)
    path = Path(ref).expanduser()
    if path.is_file() and path.name.endswith(".json"):
        path = path.parent
    if (path / "config.json").is_file():
        return shape_from_config(AutoConfig.from_pretrained(str(path)), name=ref)
    raise ConfigError(
        f"{ref!r} is neither a published model areno knows ({', '.join(PUBLISHED)}), a "
        "random: reference, nor a local directory or config.json; give the sizes instead "
        "(--layers, --hidden, --heads, --kv-heads, --intermediate, --vocab, ...)"
    )


def published_parameter_count(name: str) -> float:
    """The parameter count a model's card states (for checks against :meth:`total_params`)."""
    return float(PUBLISHED[name]["card_params"])

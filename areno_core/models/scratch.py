"""Randomly initialised models of a real architecture, named by a ``random:`` reference.

Reference syntax (usable anywhere a checkpoint is expected, e.g. ``--ckpt``)::

    random:qwen3                      # the tiny preset
    random:qwen3-small                # a named preset
    random:qwen3-mini?seed=3          # preset plus overrides
    random:qwen3?hidden_size=128&num_hidden_layers=4&seed=0
    random:qwen3?chat_template=chatml-compact   # tools rendered as one short line each

The vocabulary is the byte-level tokenizer from :mod:`areno_core.models.tokenizer` (its length
rounded up to a multiple of 8), with the chat template ``chat_template`` names (``chatml`` by
default, see ``CHAT_TEMPLATES`` there); the input and output embeddings are tied. Initialisation is
deterministic for a given ``seed`` (default 0) and does not disturb the global torch RNG.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import attrs
import torch
from transformers import PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from areno_core.errors import ConfigError
from areno_core.log import get_logger
from areno_core.models.tokenizer import CHAT_TEMPLATES, build_byte_tokenizer

logger = get_logger(__name__)

RANDOM_PREFIX = "random:"
ARCHITECTURES: tuple[str, ...] = ("qwen3",)
DEFAULT_PRESET = "tiny"
VOCAB_MULTIPLE = 8

# Parameter counts (tied embeddings, byte tokenizer vocabulary of 272) are in docs/models.md and
# checked by tests/models/test_scratch.py.
PRESETS: Mapping[str, Mapping[str, int]] = {
    # ~91K parameters: unit tests and smoke runs.
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "max_position_embeddings": 2048,
    },
    # ~2.4M parameters: CPU learning experiments that should show real progress.
    "mini": {
        "hidden_size": 192,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 512,
        "max_position_embeddings": 4096,
    },
    # ~20.6M parameters: throughput benchmarks.
    "small": {
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "intermediate_size": 1152,
        "max_position_embeddings": 4096,
    },
}


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be > 0")
    return value


def _chat_template(text: str) -> str:

    if text not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {text!r}")
    return text


# Architecture fields that take a positive integer, and those that take a positive number.
_INT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
)
_FLOAT_FIELDS = ("rope_theta", "rms_norm_eps", "initializer_range")

# Override key -> (parser, description of a valid value).
OVERRIDES: Mapping[str, tuple[Callable[[str], Any], str]] = {
    **dict.fromkeys(_INT_FIELDS, (_positive_int, "a positive integer")),
    **dict.fromkeys(_FLOAT_FIELDS, (_positive_float, "a positive number")),
    "tie_word_embeddings": (_parse_bool, "true or false"),
    "seed": (_non_negative_int, "a non-negative integer"),
    "chat_template": (_chat_template, "'chatml' or 'chatml-compact'"),
}
# Overrides that are not architecture fields of the model config.
_NOT_ARCHITECTURE = ("seed", "chat_template")


@attrs.frozen
class RandomModelSpec:
    """A parsed ``random:`` reference."""

    arch: str
    preset: str
    overrides: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def seed(self) -> int:
        return int(self.overrides.get("seed", 0))

    @property
    def chat_template(self) -> str:
        """The name of the byte tokenizer's chat template (``chatml`` unless overridden)."""
        return str(self.overrides.get("chat_template", "chatml"))

    def architecture_kwargs(self) -> dict[str, Any]:
        """The config fields of the preset with the overrides applied (``seed`` and
        ``chat_template`` excluded)."""
        kwargs: dict[str, Any] = dict(PRESETS[self.preset])
        given = {k: v for k, v in self.overrides.items() if k not in _NOT_ARCHITECTURE}
        kwargs.update(given)
        # A changed width or head count moves head_dim with it unless head_dim is given.
        if "head_dim" not in given and ("hidden_size" in given or "num_attention_heads" in given):
            hidden, heads = kwargs["hidden_size"], kwargs["num_attention_heads"]
            if hidden % heads:
                raise ConfigError(
                    f"hidden_size={hidden} is not divisible by num_attention_heads={heads}; "
                    "set head_dim explicitly or pick divisible values"
                )
            kwargs["head_dim"] = hidden // heads
        heads, kv_heads = kwargs["num_attention_heads"], kwargs["num_key_value_heads"]
        if heads % kv_heads:
            raise ConfigError(
                f"num_attention_heads={heads} must be a multiple of num_key_value_heads={kv_heads}"
            )
        return kwargs


def is_random_ref(ref: str) -> bool:
    """Whether ``ref`` names a randomly initialised model (``random:...``)."""
    return ref.startswith(RANDOM_PREFIX)


def parse_random_ref(ref: str) -> RandomModelSpec:
    """Parse ``random:<arch>[-<preset>][?key=value&...]``; raise :class:`ConfigError` if bad."""
    if not is_random_ref(ref):
        raise ConfigError(f"{ref!r} is not a random model reference (expected 'random:...')")
    body = ref[len(RANDOM_PREFIX) :]
    name, _, query = body.partition("?")
    arch, dash, preset = name.partition("-")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"unknown architecture {arch!r} in {ref!r}; valid architectures: "
            f"{', '.join(ARCHITECTURES)} (e.g. 'random:qwen3-tiny')"
        )
    if not dash:
        preset = DEFAULT_PRESET
    if preset not in PRESETS:
        raise ConfigError(
            f"unknown preset {preset!r} in {ref!r}; valid presets: {', '.join(PRESETS)}"
        )
    overrides: dict[str, Any] = {}
    if query:
        for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            if key not in OVERRIDES:
                raise ConfigError(
                    f"unknown override {key!r} in {ref!r}; valid keys: {', '.join(OVERRIDES)}"
                )
            parse, expected = OVERRIDES[key]
            try:
                overrides[key] = parse(raw)
            except ValueError:
                raise ConfigError(
                    f"bad value {raw!r} for {key!r} in {ref!r}: expected {expected}"
                ) from None
        if not overrides:
            raise ConfigError(f"could not parse the overrides {query!r} in {ref!r}")
    return RandomModelSpec(arch=arch, preset=preset, overrides=overrides)


def padded_vocab_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """``len(tokenizer)`` rounded up to a multiple of :data:`VOCAB_MULTIPLE`."""
    n = len(tokenizer)
    return -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def build_random_config(
    ref: str | RandomModelSpec, tokenizer: PreTrainedTokenizerBase | None = None
) -> Qwen3Config:
    """The :class:`~transformers.Qwen3Config` for a ``random:`` reference.

    ``tokenizer`` defaults to :func:`~areno_core.models.tokenizer.build_byte_tokenizer`; its
    length sets the vocabulary and its special tokens the eos/pad/bos ids.
    """

    spec = parse_random_ref(ref) if isinstance(ref, str) else ref
    tok = tokenizer if tokenizer is not None else build_byte_tokenizer(spec.chat_template)
    kwargs = spec.architecture_kwargs()
    eos_id = tok.eos_token_id
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos_id
    bos_id = tok.bos_token_id if tok.bos_token_id is not None else pad_id
    kwargs.setdefault("tie_word_embeddings", True)
    return Qwen3Config(
        vocab_size=padded_vocab_size(tok),
        max_window_layers=kwargs["num_hidden_layers"],
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        **kwargs,
    )


def build_random_model(
    ref: str | RandomModelSpec,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dtype: torch.dtype = torch.float32,
) -> Qwen3ForCausalLM:
    """A freshly initialised :class:`~transformers.Qwen3ForCausalLM` for a ``random:`` ref.

    The same reference (same seed) always gives the same weights. The model is returned in
    eval mode, like ``from_pretrained`` models.
    """
    spec = parse_random_ref(ref) if isinstance(ref, str) else ref
    config = build_random_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype=dtype)
    model.eval()
    logger.debug(
        "built random qwen3 (preset=%s, seed=%d, %d parameters)",
        spec.preset,
        spec.seed,
        count_parameters(model),
    )
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "ARCHITECTURES",
    "DEFAULT_PRESET",
    "OVERRIDES",
    "PRESETS",
    "RANDOM_PREFIX",
    "RandomModelSpec",
    "build_random_config",
    "build_random_model",
    "count_parameters",
    "is_random_ref",
    "padded_vocab_size",
    "parse_random_ref",
]

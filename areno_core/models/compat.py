"""Small shims over transformers' model API, which renamed things between releases.

They take a model object and import nothing heavy, so modules that only need to ask a model a
question (is activation checkpointing on? what is its cache argument called?) stay light.
"""

from __future__ import annotations

import inspect
from typing import Any


def is_activation_checkpointing(model: Any) -> bool:
    """Whether activation checkpointing is on (transformers >= 5 renamed the property)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def enable_activation_checkpointing(model: Any) -> None:
    """Turn activation checkpointing on with non-reentrant checkpoints, under either name."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def cache_argument(model: Any) -> str:
    """The name under which ``model``'s forward takes a key/value cache: ``cache`` since
    transformers 5.24 deprecated ``past_key_values`` (removed in 5.40), ``past_key_values``
    before. A PEFT wrapper is asked about the model it wraps."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        parameters = inspect.signature(base.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The key/value cache of a model output, under either name (see :func:`cache_argument`);
    reading ``past_key_values`` where ``cache`` exists logs a deprecation warning."""
    if "cache" in getattr(type(output), "__dataclass_fields__", {}):
        return output.cache
    return output.past_key_values


__all__ = [
    "cache_argument",
    "enable_activation_checkpointing",
    "is_activation_checkpointing",
    "output_cache",
]

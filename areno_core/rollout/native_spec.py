"""The ``native`` rollout engine as the registry sees it: its options and its factory.

The engine itself (:mod:`areno_core.rollout.native`) loads transformers' model stack; this
module does not, so that building the registry and resolving a run's options stay light. The
factory imports the engine when a run creates one.
"""

from __future__ import annotations

from typing import Any

from areno_core.contracts.engine import EngineOptions, EngineSpec
from areno_core.rollout.native_config import NativeEngineConfig


def _create(
    model: Any,
    tokenizer: Any,
    options: EngineOptions | None = None,
    config: NativeEngineConfig | None = None,
) -> Any:
    from areno_core.rollout.native import NativeEngine  # heavy: the model stack, for a run

    return NativeEngine(model, tokenizer, options, config)


NATIVE_ENGINE = EngineSpec(
    name="native",
    summary="Samples from the module being trained, with a KV cache and continuous batching "
    "(CPU or one GPU); weight syncs cost nothing.",
    factory=_create,
    config_cls=NativeEngineConfig,
    lora_weights="module",  # it samples from the training module, adapters included
)


__all__ = ["NATIVE_ENGINE", "NativeEngineConfig"]

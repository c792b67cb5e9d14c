"""The ``local`` training backend as the registry sees it: its options, check and factory.

The backend itself (:mod:`areno_core.train.local`) loads the training stack; this module does
not, so that building the registry and resolving a run stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from areno_core.contracts.backend import BackendSpec
from areno_core.options import option

if TYPE_CHECKING:
    from areno_core.registry import Registry


@attrs.frozen
class LocalBackendConfig:
    """The local backend's own options (``--backend local``)."""

    share_prefix: bool = option(
        True,
        "Local backend: rows of a microbatch that start with the same prompt (the samples of "
        "one group, the two answers of a pair) run that prompt once and reuse its keys and "
        "values; off, every row runs in full.",
        negatable=True,
    )
    packed_forward: bool | None = option(
        None,
        "Local backend: run Qwen3, Qwen2 and Llama models through areno's lean forward pass "
        "with a microbatch's rows packed into one token stream (no compute on padding, a "
        "prompt shared by several rows run once, the output projection only where a loss "
        "token is predicted); other models run the transformers module. Models with "
        "flash-attn are packed either way. With activation checkpointing on, only this path "
        "shares prompts: it checkpoints its own layers. Unset: auto, packed on a CPU and on "
        "CUDA GPUs (where it was measured), padded on other devices.",
        default_text="auto",
        negatable=True,
    )


def _local_backend(config: Any, options: LocalBackendConfig, registry: Registry) -> Any:
    from areno_core.train.local import LocalBackend  # heavy: the training stack, for a run

    return LocalBackend(
        share_prefix=options.share_prefix,
        packed_forward=options.packed_forward,
        registry=registry,
    )


def _one_process(config: Any) -> str | None:
    if config.world_size > 1 or config.tp_size > 1:
        return "it trains in one process on one device (--world-size 1 --tp-size 1)"
    return None


LOCAL_BACKEND = BackendSpec(
    name="local",
    summary="Trains in this process on the CPU or one GPU.",
    factory=_local_backend,
    config_cls=LocalBackendConfig,
    check=_one_process,
)


__all__ = ["LOCAL_BACKEND", "LocalBackendConfig"]

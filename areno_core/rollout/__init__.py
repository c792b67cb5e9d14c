"""Rollout engines: sample completions (token ids + logprobs) from the policy.

``native`` (:class:`NativeEngine`) runs the training module itself with a KV cache; other
engines (for example an SGLang server) implement the same :class:`RolloutEngine` protocol.

The names below are imported from their modules when first asked for (PEP 562), so that the
package's light modules (sampling, the engine's registry entry) load without the engine's
model stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areno_core.lazy import lazy_attributes

_HOME = {
    "EngineOptions": "areno_core.contracts.engine",
    "RolloutEngine": "areno_core.contracts.engine",
    "RolloutSession": "areno_core.contracts.engine",
    "NativeEngine": "areno_core.rollout.native",
    "create_native_engine": "areno_core.rollout.native",
    "apply_top_k_top_p": "areno_core.rollout.sampling",
    "sample_next": "areno_core.rollout.sampling",
    "seeded": "areno_core.rollout.sampling",
}


__getattr__ = lazy_attributes(__name__, _HOME)

if TYPE_CHECKING:
    from areno_core.contracts.engine import EngineOptions, RolloutEngine, RolloutSession
    from areno_core.rollout.native import NativeEngine, create_native_engine
    from areno_core.rollout.sampling import apply_top_k_top_p, sample_next, seeded

__all__ = [
    "EngineOptions",
    "NativeEngine",
    "RolloutEngine",
    "RolloutSession",
    "apply_top_k_top_p",
    "create_native_engine",
    "sample_next",
    "seeded",
]

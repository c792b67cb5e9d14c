"""Rollout engines: sample completions (token ids + logprobs) from the policy.

``native`` (:class:`NativeEngine`) runs the training module itself with a KV cache; other
engines (for example an SGLang server) implement the same :class:`RolloutEngine` protocol.
"""

from __future__ import annotations

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

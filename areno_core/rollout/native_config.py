"""The ``native`` rollout engine's own options (``--rollout-engine native``), apart from the
engine (which loads the model stack) and its registry entry (which creates the engine), so
that both can import them."""

from __future__ import annotations

import attrs

from areno_core.options import option
from areno_core.validators import number

SHARED_PROMPT_MIN_TOKENS = 16
"""``shared_prompt_cache`` auto: the shortest mean prompt length (tokens) of a ``generate()``
call whose prompts are kept once per group. Measured on CPU (docs/performance.md): with
5-token prompts the copies took 0.87x the shared layout's rollout CPU time on
``random:qwen3-tiny`` and 0.96x at 8 tokens on ``random:qwen3-small``; from 16 tokens on the
small model, and 64 on the tiny one, the shared layout is as fast or faster."""


@attrs.frozen
class NativeEngineConfig:
    """The native engine's own options (``--rollout-engine native``)."""

    prefill_batch_tokens: int = option(
        16384,
        "Native engine: most padded prompt tokens per prefill forward pass; larger admissions "
        "are split into several passes (lower it to bound prefill memory).",
        validator=number(min=1, integer=True),
    )
    lean_forward: bool = option(
        True,
        "Native engine: on a CPU, run Qwen3, Qwen2 and Llama models through areno's lean "
        "forward pass (the same operations as the transformers module with SDPA attention, so "
        "the same numbers in float32, without its per-call overhead; a bfloat16 model attends "
        "in float32); off, or for other models and on GPUs, the transformers module runs.",
        negatable=True,
    )
    shared_prompt_cache: bool | None = option(
        None,
        "Native engine: when a prompt is sampled several times (n > 1) and the lean forward "
        "pass runs, keep its keys/values once per group of samples and let decode steps "
        "attend to it once per group (exact up to rounding; less memory); off, every sample's "
        "row holds its own copy of the prompt. Unset: auto, shared when a generate() call's "
        f"prompts average at least {SHARED_PROMPT_MIN_TOKENS} tokens (on shorter ones the "
        "second attention call per layer costs more than the copies save).",
        default_text="auto",
        negatable=True,
    )
    prepacked_weights: bool = option(
        True,
        "Native engine: with the lean forward pass and a bfloat16 model on a CPU whose oneDNN "
        "has bfloat16 products (AVX512-BF16 or AMX), copy the linear weights into oneDNN's own "
        "layout once per generate() call of at least 32 new tokens (same numbers; faster "
        "decode). The copies hold as much memory as those weights while a call runs; off, "
        "products read the weights as they are.",
        negatable=True,
    )


__all__ = ["SHARED_PROMPT_MIN_TOKENS", "NativeEngineConfig"]

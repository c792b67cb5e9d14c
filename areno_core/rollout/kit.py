"""What every rollout engine does the same way, for the native engine, the SGLang engine and a
third party's engine alike: which token ids end a completion, which prompts a ``generate``
call samples, how finished token sequences become :class:`~areno_core.types.Completion` objects,
and the statistics every engine keeps in its ``stats``.

An engine's ``generate`` is then, in outline::

    kept = admit_prompts(prompts, sampling, n, max_prompt_tokens=self.options.max_prompt_tokens)
    results = [[] for _ in prompts]
    finished = ...  # this engine's own sampling: FinishedSample per request of a kept prompt
    add_completions(results, prompts, finished, self.tokenizer, self.policy_version)
    count_generation(self.stats, prompts, kept, results, seconds)

See docs/plugin-authors.md ("Writing a rollout engine").
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import attrs

from areno_core.log import get_logger, warn_once
from areno_core.rollout.sampling import validate_sampling
from areno_core.types import Completion, FinishReason, SamplingParams

logger = get_logger(__name__)

GENERATION_STAT_KEYS: tuple[str, ...] = (
    "prompts",
    "skipped_prompts",
    "completions",
    "prompt_tokens",
    "generated_tokens",
    "generate_time_s",
    "tokens_per_s",
    "weight_syncs",
)
"""The statistics :func:`count_generation` keeps (plus ``weight_syncs``, which an engine counts
in its ``sync_weights``); an engine adds its own keys after these."""


def resolve_eos(model: Any, tokenizer_or_eos_ids: Any) -> tuple[Any, tuple[int, ...]]:
    """The tokenizer (None when given ids) and the sorted token ids that end a completion.

    ``tokenizer_or_eos_ids`` is either a tokenizer (its ``eos_token_id``, plus the model's
    ``generation_config.eos_token_id``: chat models often end turns with a token other than the
    tokenizer's EOS) or the EOS ids themselves (an int or a collection of ints)."""

    def as_ids(value: Any) -> set[int]:
        if value is None:
            return set()
        if isinstance(value, int):
            return {int(value)}
        return {int(v) for v in value}

    source = tokenizer_or_eos_ids
    is_ids = isinstance(source, (list, tuple, set, frozenset)) and all(
        isinstance(v, int) for v in source
    )
    if isinstance(source, int) or is_ids:
        return None, tuple(sorted(as_ids(source)))
    ids: set[int] = set()
    if source is not None:
        ids |= as_ids(getattr(source, "eos_token_id", None))
    ids |= as_ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    if not ids:
        logger.debug("no EOS token known: completions end at max_new_tokens or stop_token_ids")
    return source, tuple(sorted(ids))


def admit_prompts(
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams,
    n: int,
    *,
    max_prompt_tokens: int,
) -> list[int]:
    """Check a ``generate`` call and return the indices of the prompts it samples: every
    prompt of at most ``max_prompt_tokens`` tokens. A longer prompt gets no completions (once
    per process a warning says so; the statistics count it as ``skipped_prompts``). Invalid
    sampling settings, ``n < 1`` or an empty prompt are a ``ValueError``."""
    validate_sampling(sampling)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    kept: list[int] = []
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} has no tokens")
        if len(prompt) <= max_prompt_tokens:
            kept.append(i)
    if len(kept) < len(prompts):
        warn_once(
            logger,
            "rollout.skipped_prompts",
            "skipping prompts longer than max_prompt_tokens=%d (counted in "
            "rollout stats 'skipped_prompts')",
            max_prompt_tokens,
        )
    return kept


@attrs.frozen
class FinishedSample:
    """One finished request: the prompt it answers (its index in the ``generate`` call), the
    sampled ids with their logprobs, and why it ended (with ``"stop"`` the last id is the
    stop token)."""

    prompt_index: int
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    finish_reason: FinishReason


def add_completions(
    results: list[list[Completion]],
    prompts: Sequence[Sequence[int]],
    finished: Iterable[FinishedSample],
    tokenizer: Any,
    policy_version: int,
) -> None:
    """Append a :class:`Completion` to ``results[prompt_index]`` for each finished sample, in
    the order given (an engine gives each prompt's samples in sample order). The text is
    decoded without the stop token, special tokens kept; without a tokenizer it is empty."""
    finished = list(finished)
    texts = [""] * len(finished)
    if tokenizer is not None:
        bodies = [
            list(f.token_ids[:-1] if f.finish_reason == "stop" else f.token_ids) for f in finished
        ]
        texts = decode_texts(tokenizer, bodies)
    for sample, text in zip(finished, texts, strict=True):
        results[sample.prompt_index].append(
            Completion(
                prompt_ids=tuple(prompts[sample.prompt_index]),
                token_ids=tuple(sample.token_ids),
                logprobs=tuple(sample.logprobs),
                text=text,
                finish_reason=sample.finish_reason,
                policy_version=policy_version,
            )
        )


def decode_texts(tokenizer: Any, bodies: list[list[int]]) -> list[str]:
    """``tokenizer.batch_decode(bodies, skip_special_tokens=False)``, the same strings.

    A transformers tokenizer backed by the ``tokenizers`` library that decodes the standard
    way (no space clean-up, no decode method of its own) decodes each body straight through
    its backend: transformers' conversion of the input, which walks every id of every body in
    Python, cost 1.1 ms of the 1.4 ms that 128 eight-token completions took.
    """
    backend = _plain_backend(tokenizer)
    if backend is None:
        return tokenizer.batch_decode(bodies, skip_special_tokens=False)
    return [backend.decode(body, skip_special_tokens=False) for body in bodies]


def _plain_backend(tokenizer: Any) -> Any:
    """The ``tokenizers`` backend whose ``decode`` is all ``tokenizer.batch_decode`` does,
    or None: the class must take ``batch_decode``/``decode`` from transformers' base class
    and ``_decode`` from its ``TokenizersBackend`` (transformers 5), without clean-up."""
    cls = type(tokenizer)
    base = next((c for c in cls.__mro__ if c.__name__ == "PreTrainedTokenizerBase"), None)
    decode = getattr(cls, "_decode", None)
    if (
        base is None
        or not base.__module__.startswith("transformers.")
        or cls.batch_decode is not base.batch_decode
        or cls.decode is not base.decode
        or getattr(decode, "__qualname__", "") != "TokenizersBackend._decode"
        or not decode.__module__.startswith("transformers.")
        or getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False
    ):
        return None
    return getattr(tokenizer, "backend_tokenizer", None)


def count_generation(
    stats: MutableMapping[str, float],
    prompts: Sequence[Sequence[int]],
    kept: Sequence[int],
    results: Sequence[Sequence[Completion]],
    seconds: float,
) -> None:
    """Add one ``generate`` call to an engine's statistics (:data:`GENERATION_STAT_KEYS`):
    prompts asked and skipped, completions, prompt tokens (once per completion) and generated
    tokens, time, and the running tokens per second."""
    stats["prompts"] += len(prompts)
    stats["skipped_prompts"] += len(prompts) - len(kept)
    stats["completions"] += sum(len(r) for r in results)
    stats["prompt_tokens"] += sum(len(prompts[i]) * len(results[i]) for i in kept)
    stats["generated_tokens"] += sum(len(c.token_ids) for r in results for c in r)
    stats["generate_time_s"] += seconds
    if stats["generate_time_s"] > 0:
        stats["tokens_per_s"] = stats["generated_tokens"] / stats["generate_time_s"]


__all__ = [
    "GENERATION_STAT_KEYS",
    "FinishedSample",
    "add_completions",
    "admit_prompts",
    "count_generation",
    "decode_texts",
    "resolve_eos",
]

"""Pure translation between areno's sampling contract and SGLang's ``/generate`` JSON.

Request (one entry per sample: a prompt's ``n`` samples are ``n`` entries)::

    {"input_ids": [[...], ...], "sampling_params": [{...}, ...], "return_logprob": true,
     "logprob_start_len": -1, "stream": false}

with each ``sampling_params`` entry holding ``max_new_tokens``, ``temperature`` (0 for greedy),
``top_k`` (-1 disables), ``top_p``, ``min_p`` 0, ``stop_token_ids`` (the EOS ids and the stop
ids), ``no_stop_trim`` and, for seeded sampling, ``sampling_seed`` (a seed per sample, derived
from the call's seed and the sample's position).

Response entry (what is read)::

    {"output_ids": [...],                       # optional; checked against the logprobs
     "meta_info": {"output_token_logprobs": [[logprob, token_id, text_or_null], ...],
                   "finish_reason": {"type": "stop" | "length" | "abort", ...},
                   "weight_version": "3", "cached_tokens": 0, ...}}

SGLang reports ``log(softmax(logits / temperature))`` of the sampled token before top-k/top-p
(``log_softmax(logits)`` for greedy requests), which is areno's ``Completion.logprobs``
contract, unless its server runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB`` set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import attrs

from areno_core.rollout.sampling import is_greedy
from areno_core.types import FinishReason, SamplingParams
from areno_sglang.client import SGLangServerError

_SEED_LIMIT = 2**62


def sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """A seed for one sample, from the call's seed and the sample's position (the same inputs
    always give the same seed; neighbours differ)."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{sample_index}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") % _SEED_LIMIT


def sglang_sampling(
    sampling: SamplingParams, stop_ids: Sequence[int], seed: int | None
) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one sample."""
    greedy = is_greedy(sampling)
    params: dict[str, Any] = {
        "max_new_tokens": int(sampling.max_new_tokens),
        "temperature": 0.0 if greedy else float(sampling.temperature),
        "top_k": -1 if greedy else int(sampling.top_k),
        "top_p": 1.0 if greedy else float(sampling.top_p),
        "min_p": 0.0,
        "stop_token_ids": sorted({int(t) for t in stop_ids}),
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    if seed is not None and not greedy:
        params["sampling_seed"] = int(seed)
    return params


@attrs.frozen
class Request:
    """One sample to generate: ``prompts[prompt_index]``, sample ``sample_index``."""

    prompt_index: int
    sample_index: int


def generate_payload(
    prompts: Sequence[Sequence[int]],
    requests: Sequence[Request],
    sampling: SamplingParams,
    stop_ids: Sequence[int],
) -> dict[str, Any]:
    """The ``/generate`` body for ``requests`` (in order)."""
    seeds = [
        None
        if sampling.seed is None
        else sample_seed(sampling.seed, r.prompt_index, r.sample_index)
        for r in requests
    ]
    return {
        "input_ids": [list(map(int, prompts[r.prompt_index])) for r in requests],
        "sampling_params": [sglang_sampling(sampling, stop_ids, s) for s in seeds],
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": False,
    }


@attrs.frozen
class Output:
    """One parsed ``/generate`` output."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: str | None
    cached_tokens: int


def parse_output(
    item: dict[str, Any], stop_ids: Sequence[int], *, max_new_tokens: int, server: str
) -> Output:
    """An :class:`Output` from one response entry. A completion whose last token is a stop
    token finishes with ``stop`` (SGLang says ``length`` when it comes exactly at the cap; the
    native engine says ``stop``); anything malformed or aborted is an error naming ``server``."""
    meta = item.get("meta_info")
    if not isinstance(meta, dict):
        raise SGLangServerError(f"SGLang server {server}: an output has no meta_info: {item!r}")
    pairs = meta.get("output_token_logprobs")
    if not isinstance(pairs, list):
        raise SGLangServerError(
            f"SGLang server {server}: an output has no output_token_logprobs (was "
            "return_logprob dropped?)"
        )
    try:
        token_ids = tuple(int(p[1]) for p in pairs)
        logprobs = tuple(float(p[0]) for p in pairs)
    except (TypeError, ValueError, IndexError) as exc:
        raise SGLangServerError(
            f"SGLang server {server}: output_token_logprobs entries must be [logprob, "
            f"token_id, ...], got {pairs[:3]!r}"
        ) from exc
    output_ids = item.get("output_ids")
    if output_ids is not None and [int(t) for t in output_ids] != list(token_ids):
        raise SGLangServerError(
            f"SGLang server {server}: output_ids ({len(output_ids)} tokens) disagree with "
            f"output_token_logprobs ({len(token_ids)} tokens)"
        )
    if not token_ids or len(token_ids) > max_new_tokens:
        raise SGLangServerError(
            f"SGLang server {server}: an output has {len(token_ids)} tokens, expected 1 to "
            f"{max_new_tokens}"
        )
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind == "abort":
        message = finish.get("message") if isinstance(finish, dict) else None
        raise SGLangServerError(f"SGLang server {server} aborted a request: {message or finish}")
    if token_ids[-1] in set(stop_ids):
        reason: FinishReason = "stop"
    elif kind in ("stop", "length"):
        reason = kind
    else:
        raise SGLangServerError(
            f"SGLang server {server}: unexpected finish_reason {finish!r} (expected stop or length)"
        )
    version = meta.get("weight_version")
    return Output(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
        weight_version=None if version is None else str(version),
        cached_tokens=int(meta.get("cached_tokens") or 0),
    )

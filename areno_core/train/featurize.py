"""Turn supervised and preference rows into token trajectories."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from areno_core.errors import DatasetError
from areno_core.models.chat import encode_sft_example
from areno_core.types import Trajectory


@attrs.define
class FeaturizeStats:
    rows: int = 0
    skipped_long_prompts: int = 0
    truncated_responses: int = 0


def _trajectory(
    tokenizer: Any,
    prompt: Any,
    response: Any,
    *,
    index: int,
    max_prompt_tokens: int,
    max_new_tokens: int,
    disable_thinking: bool,
    stats: FeaturizeStats,
    tools: Any = None,
    metadata: dict[str, Any] | None = None,
) -> Trajectory | None:
    """Row ``index``'s ``prompt`` (context, mask 0) and ``response`` (the target) as one
    trajectory, the response cut to ``max_new_tokens``; None (counted) when the prompt is
    longer than ``max_prompt_tokens``."""
    try:
        ids, mask = encode_sft_example(
            tokenizer, prompt, response, disable_thinking=disable_thinking, tools=tools or None
        )
    except DatasetError as exc:
        raise DatasetError(f"row {stats.rows - 1}: {exc}") from exc
    prompt_len = mask.index(1) if 1 in mask else len(mask)
    if prompt_len > max_prompt_tokens:
        stats.skipped_long_prompts += 1
        return None
    if len(ids) - prompt_len > max_new_tokens:
        stats.truncated_responses += 1
        ids, mask = ids[: prompt_len + max_new_tokens], mask[: prompt_len + max_new_tokens]
    ids, mask = list(ids), list(mask)
    return Trajectory(
        input_ids=ids,
        loss_mask=mask,
        rollout_logprobs=[0.0] * len(ids),
        prompt_len=prompt_len,
        prompt_index=index,
        metadata=metadata or {},
    )


def sft_trajectories(
    rows: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_prompt_tokens: int,
    max_new_tokens: int,
    disable_thinking: bool = False,
) -> tuple[list[Trajectory], FeaturizeStats]:
    """One trajectory per row: the prompt is context (mask 0), the response is the target."""
    stats = FeaturizeStats()
    out = []
    for i, row in enumerate(rows):
        stats.rows += 1
        trajectory = _trajectory(
            tokenizer,
            row["prompt"],
            row["response"],
            index=i,
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens,
            disable_thinking=disable_thinking,
            stats=stats,
            tools=row.get("tools"),
        )
        if trajectory is not None:
            out.append(trajectory)
    return out, stats


def preference_trajectories(
    rows: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    *,
    max_prompt_tokens: int,
    max_new_tokens: int,
    disable_thinking: bool = False,
) -> tuple[list[Trajectory], FeaturizeStats]:
    """Two adjacent trajectories per row: chosen (even index) then rejected (odd index)."""
    stats = FeaturizeStats()
    out: list[Trajectory] = []
    for i, row in enumerate(rows):
        stats.rows += 1
        pair = []
        for key in ("chosen", "rejected"):
            trajectory = _trajectory(
                tokenizer,
                row["prompt"],
                row[key],
                index=i,
                max_prompt_tokens=max_prompt_tokens,
                max_new_tokens=max_new_tokens,
                disable_thinking=disable_thinking,
                stats=stats,
                metadata={"preference": key},
            )
            if trajectory is None:
                break
            pair.append(trajectory)
        if len(pair) == 2:
            out.extend(pair)
    return out, stats

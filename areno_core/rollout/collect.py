"""Direct-prompt rollout: prompts -> completions -> rewards -> trajectory groups."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from areno_core.models.chat import encode_prompt
from areno_core.rewards import RewardScorer
from areno_core.rollout.sampling import seeded
from areno_core.types import (
    Completion,
    PromptItem,
    RewardRecord,
    SamplingParams,
    Trajectory,
    TrajectoryGroup,
)


def prompt_item(index: int, row: dict[str, Any]) -> PromptItem:
    """The rollout view of an RL row: a text or chat prompt plus reference answers."""
    prompt = row["prompt"]
    solutions = row.get("solutions", ())
    if isinstance(solutions, str):
        solutions = (solutions,)
    answer = row.get("answer")
    return PromptItem(
        index=index,
        row=row,
        prompt=prompt if isinstance(prompt, str) else None,
        messages=tuple(prompt) if not isinstance(prompt, str) else None,
        answer=None if answer is None else str(answer),
        solutions=tuple(str(s) for s in solutions),
    )


def encode_items(
    items: Sequence[PromptItem], tokenizer: Any, *, disable_thinking: bool
) -> list[list[int]]:
    return [
        list(
            encode_prompt(
                tokenizer,
                item.messages if item.messages is not None else item.prompt,
                disable_thinking=disable_thinking,
            )
        )
        for item in items
    ]


def completion_trajectory(
    completion: Completion, reward: float, prompt_index: int, sample_index: int
) -> Trajectory:
    p, c = len(completion.prompt_ids), len(completion.token_ids)
    return Trajectory(
        input_ids=[*completion.prompt_ids, *completion.token_ids],
        loss_mask=[0] * p + [1] * c,
        rollout_logprobs=[0.0] * p + list(completion.logprobs),
        reward=reward,
        prompt_len=p,
        finish_reason=completion.finish_reason,
        prompt_index=prompt_index,
        sample_index=sample_index,
        policy_version=completion.policy_version,
    )


def collect_groups(
    items: Sequence[PromptItem],
    *,
    engine: Any,
    tokenizer: Any,
    sampling: SamplingParams,
    n_samples: int,
    scorer: RewardScorer,
    disable_thinking: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Sample ``n_samples`` completions per item, score them, and group them per prompt."""
    t0 = time.perf_counter()
    prompts = encode_items(items, tokenizer, disable_thinking=disable_thinking)
    completions = engine.generate(prompts, seeded(sampling, generator), n=n_samples)
    t1 = time.perf_counter()
    records, where = [], []
    for item, samples in zip(items, completions, strict=True):
        prompt_text = item.prompt if item.prompt is not None else ""
        for s, comp in enumerate(samples):
            records.append(
                RewardRecord(
                    prompt=prompt_text or tokenizer.decode(list(comp.prompt_ids)),
                    completion=comp.text,
                    answer=item.answer,
                    solutions=item.solutions,
                    messages=[*(item.messages or ()), {"role": "assistant", "content": comp.text}],
                    prompt_ids=comp.prompt_ids,
                    token_ids=comp.token_ids,
                    logprobs=comp.logprobs,
                    loss_mask=(1,) * len(comp.token_ids),
                    finish_reason=comp.finish_reason,
                    row=item.row,
                    prompt_index=item.index,
                    sample_index=s,
                )
            )
            where.append((item, s, comp))
    rewards, errors = scorer.score(records)
    t2 = time.perf_counter()
    by_item: dict[int, TrajectoryGroup] = {}
    for (item, s, comp), reward in zip(where, rewards, strict=True):
        group = by_item.setdefault(item.index, TrajectoryGroup(item=item, trajectories=[]))
        group.trajectories.append(completion_trajectory(comp, reward, item.index, s))
    groups = list(by_item.values())
    skipped = sum(1 for samples in completions if not samples)
    metrics = rollout_metrics(groups, skipped=skipped, reward_errors=errors)
    metrics["time/rollout"] = t1 - t0
    metrics["time/reward"] = t2 - t1
    return groups, metrics


def rollout_metrics(
    groups: Sequence[TrajectoryGroup], *, skipped: int, reward_errors: int
) -> dict[str, float]:
    """``rollout/*`` statistics of a step's groups (accuracy: share of rewards >= 1)."""
    trajs = [t for g in groups for t in g.trajectories]
    metrics = {
        "rollout/skipped_prompts": float(skipped),
        "rollout/reward_errors": float(reward_errors),
        "rollout/samples": float(len(trajs)),
    }
    if not trajs:
        return metrics
    metrics["rollout/policy_version"] = float(min(t.policy_version for t in trajs))
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
    lengths = torch.tensor([t.num_action_tokens for t in trajs], dtype=torch.float64)
    metrics.update(
        {
            "rollout/reward_mean": float(rewards.mean()),
            "rollout/reward_std": float(rewards.std(unbiased=False)),
            "rollout/reward_min": float(rewards.min()),
            "rollout/reward_max": float(rewards.max()),
            "rollout/accuracy": float((rewards >= 1.0).double().mean()),
            "rollout/response_length_mean": float(lengths.mean()),
            "rollout/response_length_max": float(lengths.max()),
            "rollout/truncation_rate": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
        }
    )
    return metrics

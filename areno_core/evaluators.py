"""How ``areno eval`` scores a task: evaluator specs and the pass@k estimator.

A recipe pack registers an :class:`EvaluatorSpec` per recipe through ``register_evaluators``:
the held-out set, the loader and reward that score it, how long answers may be, and when a
reward counts as correct. What it leaves unset comes from the recipe's own options
(``eval_dataset_path``, its loader, reward and ``max_new_tokens``), and command-line flags
override both.

pass@k is the unbiased estimator of the probability that at least one of ``k`` samples is
correct, from ``n >= k`` samples of which ``c`` are correct::

    pass@k = 1 - C(n - c, k) / C(n, k)

averaged over prompts (computed as a product, so large ``n`` does not overflow).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from areno_core.types import TrajectoryGroup


def _positive_or_none(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"EvaluatorSpec.{attribute.name} must be a positive int, got {value!r}")


@attrs.frozen
class EvaluatorSpec:
    """How ``areno eval --recipe NAME`` scores recipe ``name``; None fields fall back to the
    recipe's options. ``extra_metrics(groups)`` may add task-specific numbers (greedy pass)."""

    name: str
    summary: str
    dataset: str | None = None
    loader: str | None = None
    reward: str | None = None
    max_new_tokens: int | None = attrs.field(default=None, validator=_positive_or_none)
    limit: int | None = attrs.field(default=None, validator=_positive_or_none)
    correct_at: float = 1.0
    extra_metrics: Callable[[Sequence[TrajectoryGroup]], dict[str, float]] | None = None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` correct among ``n`` samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def greedy_metrics(
    groups: Sequence[TrajectoryGroup], *, correct_at: float = 1.0
) -> dict[str, float]:
    """Accuracy, mean reward and response lengths of one greedy completion per prompt."""
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {"prompts": 0.0}
    rewards = [t.reward for t in trajs]
    lengths = [t.num_action_tokens for t in trajs]
    return {
        "prompts": float(len(groups)),
        "accuracy": sum(r >= correct_at for r in rewards) / len(rewards),
        "reward_mean": sum(rewards) / len(rewards),
        "response_length_mean": sum(lengths) / len(lengths),
        "response_length_max": float(max(lengths)),
        "truncation_rate": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
    }


def sampled_metrics(
    groups: Sequence[TrajectoryGroup], ks: Sequence[int], *, correct_at: float = 1.0
) -> dict[str, float]:
    """pass@k for each ``k`` (mean over prompts), and the samples' mean reward and length."""
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {}
    out: dict[str, float] = {}
    for k in ks:
        scores = [
            pass_at_k(len(g.trajectories), sum(r >= correct_at for r in g.rewards), k)
            for g in groups
            if g.trajectories
        ]
        out[f"pass@{k}"] = sum(scores) / len(scores)
    out["sampled_reward_mean"] = sum(t.reward for t in trajs) / len(trajs)
    out["sampled_response_length_mean"] = sum(t.num_action_tokens for t in trajs) / len(trajs)
    return out

"""Data that flows through a run: rows -> prompts -> completions -> rewards -> train batches.

Everything here is a plain attrs class or a dict of torch tensors; there is no custom sequence
container beyond :class:`TrainBatch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

FinishReason = Literal["stop", "length", "abort"]


@attrs.frozen
class PromptItem:
    """One dataset row as the rollout side sees it.

    Exactly one of ``prompt`` (plain text) or ``messages`` (chat list) is set.
    """

    index: int
    row: Mapping[str, Any]
    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    answer: str | None = None
    solutions: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(
                f"PromptItem {self.index}: exactly one of 'prompt' or 'messages' must be set"
            )


@attrs.frozen
class SamplingParams:
    """How the rollout engine samples one completion."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    greedy: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@attrs.frozen
class Completion:
    """What a rollout engine returns for one sampled continuation of a prompt.

    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the sampling policy
    computed from ``logits / temperature`` before top-k/top-p truncation (temperature 1 when
    greedy), so importance ratios can be taken against it; the trainer scores tokens with the
    same temperature.
    """

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: FinishReason
    policy_version: int = 0
    """The version of the policy weights that sampled it (see ``RolloutEngine.sync_weights``)."""

    def __attrs_post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Completion has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs"
            )


@attrs.define
class RewardRecord:
    """Everything a reward function may look at for one sample."""

    prompt: str
    completion: str
    answer: str | None = None
    solutions: tuple[str, ...] = ()
    messages: list[Mapping[str, Any]] = attrs.Factory(list)
    tool_calls: list[Mapping[str, Any]] = attrs.Factory(list)
    tool_results: list[Mapping[str, Any]] = attrs.Factory(list)
    prompt_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    loss_mask: tuple[int, ...] = ()
    finish_reason: str = "stop"
    row: Mapping[str, Any] = attrs.Factory(dict)
    prompt_index: int = 0
    sample_index: int = 0
    metadata: dict[str, Any] = attrs.Factory(dict)


@attrs.define
class Trajectory:
    """One sample as a single token row ready for training.

    ``input_ids`` is the whole row (prompt, then everything after it). ``loss_mask[i]`` is 1
    when token ``input_ids[i]`` is an action of the policy (trainable) and 0 for prompt or
    environment tokens. ``rollout_logprobs[i]`` is the sampling policy's log-probability of
    ``input_ids[i]`` where ``loss_mask[i]`` is 1, and 0.0 elsewhere.
    """

    input_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    reward: float = 0.0
    prompt_len: int = 0
    finish_reason: str = "stop"
    prompt_index: int = 0
    sample_index: int = 0
    metadata: dict[str, Any] = attrs.Factory(dict)
    policy_version: int = 0
    """The version of the policy that sampled it (``Completion.policy_version``)."""

    def __attrs_post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(
                f"Trajectory lengths differ: input_ids={n}, loss_mask={len(self.loss_mask)}, "
                f"rollout_logprobs={len(self.rollout_logprobs)}"
            )

    @property
    def num_action_tokens(self) -> int:
        return sum(self.loss_mask)


@attrs.define
class TrajectoryGroup:
    """The ``n_samples`` trajectories sampled for one prompt."""

    item: PromptItem
    trajectories: list[Trajectory]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]


@attrs.define
class TrainResult:
    """What :meth:`Backend.train` returns for one optimizer step (or one train call)."""

    step: int
    metrics: dict[str, float]
    checkpoint_path: str | None = None


# A train batch is a plain dict of tensors, all of shape [rows, seq] unless noted:
#   input_ids (long), attention_mask (long), loss_mask (float, aligned with input_ids: 1 where
#   the token at that position is a trainable target), old_logprobs, rollout_logprobs,
#   advantages, ref_logprobs, values, returns (float, aligned the same way).
TrainBatch = dict[str, Any]

__all__ = [
    "Completion",
    "FinishReason",
    "PromptItem",
    "RewardRecord",
    "SamplingParams",
    "TrainBatch",
    "TrainResult",
    "Trajectory",
    "TrajectoryGroup",
]

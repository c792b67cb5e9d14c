"""Training on samples drawn by an older policy: the inputs of the decoupled objective.

Three policies meet in a train step fed by asynchronous rollout (docs/async.md):

* the *behaviour* policy that sampled a trajectory (its ``policy_version``; its
  log-probabilities are the trajectory's ``rollout_logprobs``);
* the *proximal* policy, the one at the start of the train step (version
  ``model.optimizer_steps`` when the step begins);
* the policy being updated.

When every trajectory of a batch was sampled by the proximal policy (synchronous training) the
rollout log-probabilities already are the proximal ones and nothing here runs. Otherwise, for an
algorithm that declares ``decoupled``, the backend scores the batch with the proximal policy and
calls :func:`with_proximal`: ``old_logprobs`` become the proximal policy's and
``behaviour_logprobs`` keep the sampler's, which tells the loss to use the decoupled objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from areno_core.types import TrainBatch, Trajectory


def stale_rows(trajectories: Sequence[Trajectory], version: int) -> int:
    """How many ``trajectories`` were sampled by a policy other than version ``version``."""
    return sum(1 for t in trajectories if t.policy_version != version)


def with_proximal(batch: TrainBatch, proximal: torch.Tensor) -> dict[str, Any]:
    """``batch`` with ``old_logprobs`` = ``proximal`` [B, T] (the proximal policy's, aligned
    with ``input_ids``) and ``behaviour_logprobs`` = the sampler's ``rollout_logprobs``.

    ``proximal`` is zeroed outside the loss mask, like ``rollout_logprobs``.
    """
    if proximal.shape != batch["rollout_logprobs"].shape:
        raise ValueError(
            f"proximal log-probabilities have shape {tuple(proximal.shape)}, the batch "
            f"{tuple(batch['rollout_logprobs'].shape)}"
        )
    proximal = torch.where(batch["loss_mask"] > 0, proximal, torch.zeros_like(proximal))
    return {**batch, "old_logprobs": proximal, "behaviour_logprobs": batch["rollout_logprobs"]}


__all__ = ["stale_rows", "with_proximal"]

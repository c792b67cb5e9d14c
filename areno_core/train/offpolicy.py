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

How the proximal log-probabilities are obtained (``--proximal-logprobs``):

``recompute`` (exact)
    one extra forward pass of the policy over the batch before the update, without gradients.
``interpolate`` (no extra pass)
    each microbatch's forward pass already computes the current policy's log-probabilities
    ``log pi_cur``; the proximal ones are placed between the behaviour's and those, in
    proportion to the versions (optimizer steps) that separate them::

        alpha = (v_prox - v_behav) / (v_cur - v_behav)
        log pi_prox ~ log pi_behav + alpha * (log pi_cur - log pi_behav)

    In the first optimizer step of a train step the current policy *is* the proximal one
    (``alpha = 1``), so there it is exact; later optimizer steps of the same batch use the
    approximation. A sample of the proximal policy itself keeps its own log-probabilities
    (``alpha = 0``). Before the update (advantages) ``old_logprobs`` are the behaviour's.
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


def with_behaviour(batch: TrainBatch, trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """``batch`` (collated from ``trajectories``, in order) marked as holding stale samples for
    ``interpolate``: ``behaviour_logprobs`` (the sampler's) and ``behaviour_version`` [B] (the
    version that sampled each row); ``old_logprobs`` stay the sampler's until
    :func:`interpolate_proximal` replaces them per microbatch."""
    versions = torch.tensor([t.policy_version for t in trajectories], dtype=torch.long)
    if versions.shape[0] != batch["rollout_logprobs"].shape[0]:
        raise ValueError(f"{versions.shape[0]} trajectories for a batch of a different size")
    return {
        **batch,
        "behaviour_logprobs": batch["rollout_logprobs"],
        "behaviour_version": versions,
    }


def interpolate_proximal(
    microbatch: TrainBatch,
    logprobs: torch.Tensor,
    *,
    proximal_version: int,
    current_version: int,
) -> dict[str, Any]:
    """``microbatch`` with ``old_logprobs`` interpolated between the behaviour policy's and the
    current policy's ``logprobs`` [B, T] (detached) by version (see the module docstring)."""
    behaviour = microbatch["behaviour_logprobs"]
    v_behav = microbatch["behaviour_version"].to(torch.float64)
    behind = proximal_version - v_behav
    span = (current_version - v_behav).clamp(min=1.0)
    alpha = torch.where(behind > 0, behind / span, torch.zeros_like(behind))
    alpha = alpha.to(behaviour.dtype).to(behaviour.device)[:, None]
    proximal = behaviour + alpha * (logprobs.detach().to(behaviour.dtype) - behaviour)
    proximal = torch.where(microbatch["loss_mask"] > 0, proximal, torch.zeros_like(proximal))
    return {**microbatch, "old_logprobs": proximal}


PROXIMAL_MODES: tuple[str, ...] = ("recompute", "interpolate")

__all__ = [
    "PROXIMAL_MODES",
    "interpolate_proximal",
    "stale_rows",
    "with_behaviour",
    "with_proximal",
]

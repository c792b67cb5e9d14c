"""DPO: direct preference optimisation against a frozen reference model (sigmoid loss).

    areno train --algo dpo --ckpt /path/to/policy --ref-ckpt /path/to/reference \\
        --dataset-path /path/to/dpo.jsonl --dataset-loader-fn /path/to/dpo_dataset_loader.py

The loader turns each row into ``prompt``, ``chosen`` and ``rejected``. The core builds two token
rows per pair and **interleaves** them: row ``2i`` is the chosen answer and row ``2i + 1`` the
rejected answer to the same prompt, so a microbatch always holds whole pairs (an even number of
rows). The batch also carries ``ref_logprobs`` from the reference model.

For a pair, with ``p`` the policy's and ``r`` the reference's summed response log-probability::

    reward(answer) = beta * (p - r)
    loss           = -log sigmoid(reward(chosen) - reward(rejected))

averaged over the pairs of the accumulation group (``group_sequences / 2`` of them). The reward
accuracy counts the pairs whose margin is positive; a tie (a margin within float rounding, as at
step 0 when the reference is the initial policy) counts as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from areno_algos.common import masked_sum
from areno_core.algorithm import AlgorithmSpec, RowSchema
from areno_core.options import option
from areno_core.validators import number


@attrs.frozen
class DPOConfig:
    dpo_beta: float = option(
        0.1,
        "DPO temperature β on the preference margin.",
        validator=number(min=0.0, min_inclusive=False),
    )


# The policy and the reference score the same tokens in differently composed microbatches, so
# at step 0 (policy == reference) their summed log-probabilities still differ in the last float32
# bits. A margin within that rounding is a tie, and a tie is not a correctly ordered pair.
TIE_RTOL = 16 * torch.finfo(torch.float32).eps


def sequence_logprobs(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probability of each row's response tokens. ``[B, T] -> [B]``."""
    return masked_sum(logprobs, mask, dim=-1)


def pair_correct(margin: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """1 for each pair whose margin is positive beyond float rounding, else 0 (ties count 0).

    ``scale`` is the magnitude the margin was computed from (``beta`` times the sum of the four
    absolute log-probabilities of the pair); a margin of at most ``TIE_RTOL * scale`` is a tie.
    """
    return (margin > TIE_RTOL * scale).to(margin.dtype)


def dpo_loss(
    outputs: Mapping[str, Any], batch: Mapping[str, Any], config: DPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logprobs = outputs["logprobs"]
    mask = batch["loss_mask"]
    if logprobs.shape[0] % 2:
        raise ValueError(
            f"dpo: a microbatch must hold whole (chosen, rejected) pairs, got {logprobs.shape[0]} "
            "rows"
        )
    policy = sequence_logprobs(logprobs, mask)
    ref = sequence_logprobs(batch["ref_logprobs"], mask)
    reward = config.dpo_beta * (policy - ref)
    chosen, rejected = reward[0::2], reward[1::2]
    margin = chosen - rejected
    magnitude = config.dpo_beta * (policy.abs() + ref.abs()).detach()
    scale = magnitude[0::2] + magnitude[1::2]
    pairs = batch["group_sequences"] / 2

    loss = -F.logsigmoid(margin).sum() / pairs

    def share(x: torch.Tensor) -> torch.Tensor:
        return (x.detach().sum() / pairs).detach()

    stats = {
        "train/dpo_loss": loss.detach(),
        "train/rewards/chosen": share(chosen),
        "train/rewards/rejected": share(rejected),
        "train/rewards/margin": share(margin),
        "train/rewards/accuracy": share(pair_correct(margin.detach(), scale)),
        "train/logps/chosen": share(policy[0::2]),
        "train/logps/rejected": share(policy[1::2]),
    }
    return loss, stats


SPEC = AlgorithmSpec(
    name="dpo",
    summary="Direct preference optimisation on (chosen, rejected) pairs against a reference.",
    kind="preference",
    row_schema=RowSchema(
        required={"prompt": (str, list), "chosen": (str, list), "rejected": (str, list)},
        description="prompt: text or a list of chat messages; chosen / rejected: the preferred "
        "and the dispreferred answer, as text or as assistant messages.",
    ),
    config_cls=DPOConfig,
    loss=dpo_loss,
    roles=frozenset({"reference"}),
)

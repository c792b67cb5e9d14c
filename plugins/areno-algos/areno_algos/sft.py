"""SFT: supervised fine-tuning by maximum likelihood on the response tokens.

    areno train --algo sft --ckpt Qwen/Qwen3-0.6B --dataset-path yahma/alpaca-cleaned \\
        --dataset-loader-fn examples/sft/alpaca/dataset_loader.py

The loader turns each row into ``prompt`` and ``response``; the core tokenizes them and sets the
loss mask on the response tokens. The loss is the mean negative log-likelihood over every target
token of the accumulation group (not of one microbatch), so the split into microbatches does not
change the loss or its gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from areno_algos.common import masked_sum, token_share
from areno_core.algorithm import AlgorithmSpec, RowSchema


@attrs.frozen
class SFTConfig:
    """SFT reads no algorithm-specific options."""


def sft_loss(
    outputs: Mapping[str, Any], batch: Mapping[str, Any], config: SFTConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-sum(logprobs * loss_mask) / group_loss_tokens``."""
    logprobs = outputs["logprobs"]
    mask = batch["loss_mask"]
    loss = -masked_sum(logprobs, mask) / batch["group_loss_tokens"]
    stats = {"train/nll": loss.detach()}
    if "entropy" in outputs:
        stats["train/entropy"] = token_share(outputs["entropy"], mask, batch["group_loss_tokens"])
    return loss, stats


SPEC = AlgorithmSpec(
    name="sft",
    summary="Supervised fine-tuning: mean negative log-likelihood of the response tokens.",
    kind="supervised",
    row_schema=RowSchema(
        required={"prompt": (str, list), "response": (str, list)},
        description="prompt: text or a list of chat messages; response: the target text.",
    ),
    config_cls=SFTConfig,
    loss=sft_loss,
)

"""What the critic-free group algorithms (GRPO, GSPO, RLOO) share.

Each samples a group of completions per prompt, turns every row's reward into one advantage
by comparing it with its group, spreads that value over the row's loss tokens, and supports
the decoupled objective for stale samples (``--async-rollout``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_algos.common import (
    ONLINE_ROW_SCHEMA,
    Tensor,
    broadcast_over_tokens,
    require,
    token_clip_loss,
)
from areno_core.algorithm import AlgorithmSpec, LossFn

# ``(rewards, group_index) -> [B]``: one advantage per row.
RowAdvantages = Callable[[Tensor, Tensor], Tensor]


def group_advantages(batch: dict[str, Any], per_row: RowAdvantages, algo: str) -> dict[str, Any]:
    """``batch`` with ``advantages``: ``per_row(rewards, group_index)`` on every loss token of
    its row, 0 elsewhere. A batch without those keys is a KeyError naming ``algo``."""
    require(batch, ("rewards", "group_index", "loss_mask"), algo)
    values = per_row(batch["rewards"], batch["group_index"])
    return {**batch, "advantages": broadcast_over_tokens(values, batch["loss_mask"])}


def group_policy_spec(
    *,
    name: str,
    summary: str,
    config_cls: type,
    advantages: Callable[[dict[str, Any], Any], dict[str, Any]],
    loss: LossFn = token_clip_loss,
) -> AlgorithmSpec:
    """The spec of a group algorithm: online rows, groups per prompt, decoupled when stale.
    The loss is the token-level clipped ratio (GRPO's and RLOO's) unless ``loss`` is given
    (GSPO clips a sequence-level ratio)."""
    return AlgorithmSpec(
        name=name,
        summary=summary,
        kind="online",
        row_schema=ONLINE_ROW_SCHEMA,
        config_cls=config_cls,
        loss=loss,
        advantages=advantages,
        needs_groups=True,
        decoupled=True,
    )

"""The data-parallel placement: each rank runs its share of every optimizer step.

The rows of one optimizer step (the same rows, in the same order, on every rank: see
:mod:`areno_core.train.placement`) are dealt to the data-parallel ranks by length, longest
first in a back-and-forth order (0, 1, ..., n-1, n-1, ..., 0, 0, 1, ...), so every rank gets
about as many rows and tokens; units that must stay together (the two answers of a preference
pair) stay together. Each rank cuts its share into microbatches of the step's microbatch size.
The tensor-parallel ranks of one data-parallel rank run identical passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from areno_core.train.distributed.context import DistContext, combine_rank_stats
from areno_core.train.distributed.parallelize import clip_sharded_grad_norm
from areno_core.train.placement import PassPlan, Scorer, padded_passes, score_rows


def deal_units(
    micros: Sequence[Sequence[int]], lengths: torch.Tensor, unit_rows: int, ranks: int
) -> list[list[list[int]]]:
    """Split the rows of ``micros`` over ``ranks`` (see the module docstring): every rank's
    microbatches, each at most as large as the largest of ``micros``."""
    rows = [r for micro in micros for r in micro]
    units = [rows[i : i + unit_rows] for i in range(0, len(rows), unit_rows)]
    units.sort(key=lambda unit: -max(int(lengths[r]) for r in unit))
    shares: list[list[list[int]]] = [[] for _ in range(ranks)]
    for i, unit in enumerate(units):
        lap, pos = divmod(i, ranks)
        shares[pos if lap % 2 == 0 else ranks - 1 - pos].append(unit)
    size = max((len(m) for m in micros), default=unit_rows) // unit_rows or 1
    out = []
    for share in shares:
        out.append(
            [[r for unit in share[i : i + size] for r in unit] for i in range(0, len(share), size)]
        )
    return out


class DataParallelPlacement:
    """:class:`~areno_core.train.placement.UpdatePlacement` over the ``dp`` ranks of a mesh."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.rank = ctx.dp_rank

    def layout(
        self,
        micros: list[list[int]],
        plan: PassPlan,
        unit_rows: int,
        lengths: torch.Tensor,
    ) -> list[list[list[int]]]:
        if self.ctx.dp_size == 1:
            return [plan(micros)]
        return [plan(share) for share in deal_units(micros, lengths, unit_rows, self.ctx.dp_size)]

    def score(
        self,
        batch: dict[str, Any],
        plan: list[list[int]],
        device: torch.device,
        fn: Scorer,
    ) -> torch.Tensor:
        dp = self.ctx.dp_size
        layout = [plan[d::dp] for d in range(dp)]
        mine = padded_passes(layout, self.rank)
        out = score_rows(batch, mine, device, fn)
        return self.ctx.all_reduce_sum_dp(out)

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        return clip_sharded_grad_norm(params, max_norm)

    def reduce_stats(
        self,
        totals: dict[str, float],
        mins: dict[str, float],
        maxs: dict[str, float],
        losses: list[float],
    ) -> None:
        if self.ctx.dp_size == 1:
            return
        gathered = self.ctx.all_gather_objects(
            (totals, mins, maxs, losses), group=self.ctx.dp_group
        )
        combined = combine_rank_stats(gathered)
        for mine, merged in zip((totals, mins, maxs), combined[:3], strict=True):
            mine.clear()
            mine.update(merged)
        losses[:] = combined[3]

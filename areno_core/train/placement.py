"""Where the passes of a training step run: here, or spread over data-parallel processes.

``LocalBackend`` plans every optimizer step the same way whatever the number of processes:
the same rows, shuffled by the same generator, normalised by the same global token and row
counts. An :class:`UpdatePlacement` only decides which process runs which forward and backward
passes of that plan and how per-process results are combined. The default,
:class:`SingleProcess`, runs them all in this process; the distributed backend's placement
(:mod:`areno_core.train.distributed.placement`) gives each data-parallel rank its share.

Every data-parallel rank must run the same number of passes per optimizer step, because each
forward and backward pass of a sharded model is a collective operation. A rank with fewer
passes than the others runs *empty* passes: a pass over a real microbatch whose loss is
multiplied by zero and whose statistics are dropped (``[]`` in a layout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from areno_core.train.batching import select_rows
from areno_core.train.optim import clip_grad_norm

# One optimizer step's microbatches (lists of row indices) -> the passes to run for them.
PassPlan = Callable[[list[list[int]]], list[list[int]]]
Scorer = Callable[[dict[str, Any]], torch.Tensor]


class UpdatePlacement(Protocol):
    """How the passes of a training step are spread over processes (see the module docstring)."""

    rank: int
    """This process's data-parallel rank: its passes are ``layout(...)[rank]``."""

    def layout(
        self,
        micros: list[list[int]],
        plan: PassPlan,
        unit_rows: int,
        lengths: torch.Tensor,
    ) -> list[list[list[int]]]:
        """The passes of every data-parallel rank for one optimizer step's microbatches
        ``micros`` (rows come in units of ``unit_rows`` consecutive rows that stay together;
        ``lengths[r]`` is row ``r``'s token count): ``plan`` turns the microbatches a rank
        gets into its passes."""

    def score(
        self,
        batch: dict[str, Any],
        plan: list[list[int]],
        device: torch.device,
        fn: Scorer,
    ) -> torch.Tensor:
        """``fn`` (a no-grad per-token scorer) over every row of ``batch``, in the microbatches
        of ``plan``; ``[B, T]`` on the CPU, the same in every process."""

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """Clip the global gradient norm of ``params`` to ``max_norm``; the norm before."""

    def reduce_stats(
        self,
        totals: dict[str, float],
        mins: dict[str, float],
        maxs: dict[str, float],
        losses: list[float],
    ) -> None:
        """Combine this process's sums, minima, maxima and per-step losses with the other
        data-parallel ranks', in place."""


class SingleProcess:
    """Every pass runs in this process (``LocalBackend``'s default placement)."""

    rank = 0

    def layout(
        self,
        micros: list[list[int]],
        plan: PassPlan,
        unit_rows: int,
        lengths: torch.Tensor,
    ) -> list[list[list[int]]]:
        return [plan(micros)]

    def score(
        self,
        batch: dict[str, Any],
        plan: list[list[int]],
        device: torch.device,
        fn: Scorer,
    ) -> torch.Tensor:
        return score_rows(batch, plan, device, fn)

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        return clip_grad_norm(params, max_norm)

    def reduce_stats(
        self,
        totals: dict[str, float],
        mins: dict[str, float],
        maxs: dict[str, float],
        losses: list[float],
    ) -> None:
        return None


def padded_passes(layout: list[list[list[int]]], rank: int) -> list[list[int]]:
    """``rank``'s passes, with empty passes appended up to the longest rank's count."""
    mine = layout[rank]
    width = max(len(passes) for passes in layout)
    return mine + [[] for _ in range(width - len(mine))]


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@torch.no_grad()
def score_rows(
    batch: dict[str, Any],
    plan: Sequence[Sequence[int]],
    device: torch.device,
    fn: Scorer,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run a no-grad scorer over ``batch`` in the microbatches of ``plan``; ``[B, T]`` on the
    CPU (rows outside ``plan`` stay 0, or keep what ``out`` held). An empty microbatch runs
    ``fn`` on the batch's first row and drops the result (an empty pass)."""
    if out is None:
        out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
    for rows in plan:
        mb = to_device(select_rows(batch, list(rows) or [0]), device)
        values = fn(mb).float().cpu()
        if rows:
            out[torch.tensor(list(rows)), : values.shape[1]] = values
    return out


__all__ = [
    "PassPlan",
    "SingleProcess",
    "UpdatePlacement",
    "padded_passes",
    "score_rows",
    "to_device",
]

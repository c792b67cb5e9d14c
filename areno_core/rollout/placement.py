"""Where a run's rollouts run: which module the engine samples from, how it gets current
weights, and how each step's prompts are shared when training spans several processes.

A training backend of several processes provides one (``rollout_placement``); otherwise the
engine samples from the policy module in this one process (:meth:`RolloutPlacement.local`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from areno_core.rollout.collect import merge_rollout_metrics
from areno_core.types import TrajectoryGroup

if TYPE_CHECKING:
    from areno_core.model import TrainableModel


@attrs.frozen
class RolloutPlacement:
    """Where a run's rollouts run (a training backend may provide one: ``rollout_placement``).

    ``policy``: the module the engine is created on; ``weights()``: what ``sync_weights``
    hands the engine (every process calls it at the same points, so it may be a collective);
    ``rank`` / ``size``: this process's place among the processes that share each step's
    prompts; ``gather(obj)``: every process's ``obj``, in rank order (a collective).
    """

    policy: Any
    weights: Callable[[], Any]
    rank: int = 0
    size: int = 1
    gather: Callable[[Any], list[Any]] | None = None

    @classmethod
    def local(cls, model: TrainableModel) -> RolloutPlacement:
        """One process sampling from the policy module itself (no copy, free syncs)."""
        return cls(model.policy, lambda: model.policy)

    def share(self, count: int) -> tuple[int, int]:
        """The ``[start, stop)`` block of ``count`` prompts this process samples."""
        return share_bounds(count, self.rank, self.size)

    def gather_groups(
        self, groups: list[TrajectoryGroup], metrics: dict[str, float], generator: Any = None
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """Every process's groups (in prompt order) and their merged metrics. The random
        generator, when given, takes rank 0's state everywhere, so later draws agree."""
        if self.size == 1 or self.gather is None:
            return groups, metrics
        state = generator.get_state() if generator is not None else None
        parts = self.gather((groups, metrics, state))
        every = [g for part in parts for g in part[0]]
        if generator is not None:
            generator.set_state(parts[0][2])
        return every, merge_rollout_metrics([part[1] for part in parts], every)


def share_bounds(count: int, rank: int, size: int) -> tuple[int, int]:
    """Contiguous, balanced blocks: rank ``r`` of ``size`` gets ``[start, stop)`` of ``count``."""
    base, extra = divmod(count, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


__all__ = ["RolloutPlacement", "share_bounds"]

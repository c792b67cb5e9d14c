"""From trajectories to tensors: collation, microbatch planning, trimming.

No compute is spent on padding beyond what a microbatch needs: rows of an optimizer step are
sorted by length into microbatches, and each microbatch is trimmed to its own longest row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from areno_core.types import TrainBatch, Trajectory

# Per-token float fields a trajectory list can carry into a batch.
TOKEN_FIELDS = ("rollout_logprobs",)


def collate(trajectories: Sequence[Trajectory], pad_id: int) -> TrainBatch:
    """Right-pad trajectories into one batch dict of [B, T] tensors (+ per-row scalars)."""
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    width = max(len(t.input_ids) for t in trajectories)
    rows = len(trajectories)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width), dtype=torch.float32)
    rollout_logprobs = torch.zeros((rows, width), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        n = len(t.input_ids)
        input_ids[i, :n] = torch.tensor(t.input_ids, dtype=torch.long)
        attention_mask[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        rollout_logprobs[i, :n] = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
    loss_mask[:, 0] = 0.0  # the first token is never predicted
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "rollout_logprobs": rollout_logprobs,
        "old_logprobs": rollout_logprobs,
        "rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "group_index": torch.tensor([t.prompt_index for t in trajectories], dtype=torch.long),
        "lengths": attention_mask.sum(dim=1),
    }


def select_rows(batch: TrainBatch, rows: Sequence[int] | torch.Tensor) -> TrainBatch:
    """The sub-batch of ``rows``, trimmed to the longest of them (no wasted padding)."""
    index = torch.as_tensor(rows, dtype=torch.long)
    width = int(batch["lengths"][index].max())
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            out[key] = value
        elif value.dim() == 1:
            out[key] = value[index]
        else:
            out[key] = value[index, :width]
    return out


def plan_steps(
    num_units: int,
    unit_rows: int,
    mini_bs: int,
    accumulation: int | None,
    generator: torch.Generator,
) -> list[list[list[int]]]:
    """Split rows into optimizer steps of microbatches.

    Rows come in units of ``unit_rows`` consecutive rows that must stay together (2 for DPO
    pairs, 1 otherwise). Units are shuffled with ``generator``; ``mini_bs`` rows form a
    microbatch; ``accumulation`` microbatches form an optimizer step (``None``: all of them).
    Returns ``steps[microbatches[row indices]]``; length sorting happens in :func:`sort_by_length`.
    """
    if num_units == 0:
        return []
    order = torch.randperm(num_units, generator=generator).tolist()
    units_per_micro = max(1, mini_bs // unit_rows)
    micro_units = [order[i : i + units_per_micro] for i in range(0, num_units, units_per_micro)]
    per_step = len(micro_units) if accumulation is None else accumulation
    steps = []
    for s in range(0, len(micro_units), per_step):
        step_units = [u for micro in micro_units[s : s + per_step] for u in micro]
        steps.append(
            [
                [
                    u * unit_rows + r
                    for u in step_units[m : m + units_per_micro]
                    for r in range(unit_rows)
                ]
                for m in range(0, len(step_units), units_per_micro)
            ]
        )
    return steps


def sort_by_length(step: list[list[int]], lengths: torch.Tensor, unit_rows: int) -> list[list[int]]:
    """Regroup one optimizer step's rows into microbatches of similar length (same sizes)."""
    rows = [r for micro in step for r in micro]
    units = [rows[i : i + unit_rows] for i in range(0, len(rows), unit_rows)]
    units.sort(key=lambda unit: max(int(lengths[r]) for r in unit))
    sizes = [len(micro) // unit_rows for micro in step]
    out, start = [], 0
    for size in sizes:
        out.append([r for unit in units[start : start + size] for r in unit])
        start += size
    return out


def padding_fraction(micro_rows: Sequence[Sequence[int]], lengths: torch.Tensor) -> float:
    """Fraction of token slots in the given microbatches that are padding."""
    total = used = 0
    for rows in micro_rows:
        lens = [int(lengths[r]) for r in rows]
        total += max(lens) * len(lens)
        used += sum(lens)
    return 0.0 if total == 0 else 1.0 - used / total

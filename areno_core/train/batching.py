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
    lengths = torch.tensor([len(t.input_ids) for t in trajectories], dtype=torch.long)
    rows, width = len(trajectories), int(lengths.max())
    # Row-major order of the valid slots is the order of the concatenated rows: one copy per
    # field instead of one small tensor per row.
    valid = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    input_ids[valid] = torch.tensor(
        [x for t in trajectories for x in t.input_ids], dtype=torch.long
    )
    attention_mask = valid.long()
    loss_mask = torch.zeros((rows, width), dtype=torch.float32)
    loss_mask[valid] = torch.tensor(
        [x for t in trajectories for x in t.loss_mask], dtype=torch.float32
    )
    rollout_logprobs = torch.zeros((rows, width), dtype=torch.float32)
    rollout_logprobs[valid] = torch.tensor(
        [x for t in trajectories for x in t.rollout_logprobs], dtype=torch.float32
    )
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


def split_by_padding(
    rows: Sequence[int], lengths: torch.Tensor, piece_cost: int
) -> list[list[int]]:
    """Cut one microbatch into pieces of similar length, run one after the other.

    Each piece is padded only to its own longest row. The cut minimises the padded token count
    plus ``piece_cost`` tokens per piece (the fixed cost of one more forward and backward pass),
    so rows of very different lengths stop paying for each other's padding, and rows of equal
    length stay together. Gradients are summed over pieces exactly as over microbatches.
    """
    order = sorted(rows, key=lambda r: int(lengths[r]))
    lens = [int(lengths[r]) for r in order]
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for begin in range(end):
            cost = best[begin] + (end - begin) * lens[end - 1] + piece_cost
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    pieces, end = [], len(order)
    while end > 0:
        pieces.append(order[cut[end] : end])
        end = cut[end]
    return pieces[::-1]


def padding_fraction(micro_rows: Sequence[Sequence[int]], lengths: torch.Tensor) -> float:
    """Fraction of token slots in the given microbatches that are padding."""
    total = used = 0
    every = lengths.tolist()  # one conversion, not one tensor read per row
    for rows in micro_rows:
        lens = [int(every[r]) for r in rows]
        total += max(lens) * len(lens)
        used += sum(lens)
    return 0.0 if total == 0 else 1.0 - used / total

"""Fixtures for the areno-algos tests: batch builders and the microbatch-split check."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import torch
from areno_algos.common import combine_stats

TOL = {"atol": 1e-12, "rtol": 1e-10}

SplitCheck = Callable[..., None]


def slice_rows(d: Mapping[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows ``start:stop`` of every tensor with a row dimension; other values unchanged."""
    return {
        k: v[start:stop] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v
        for k, v in d.items()
    }


def _leaves(outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: v.detach().clone().requires_grad_(k in ("logprobs", "values"))
        for k, v in outputs.items()
    }


def _check_split(
    loss_fn: Callable[..., Any],
    outputs: Mapping[str, torch.Tensor],
    batch: Mapping[str, Any],
    config: Any,
    bounds: Sequence[int],
) -> None:
    """One microbatch vs. the same group split at ``bounds``: equal loss, grads and stats."""
    group = {
        **batch,
        "group_loss_tokens": float((batch["loss_mask"] > 0).sum()),
        "group_sequences": float(batch["loss_mask"].shape[0]),
    }
    whole_out = _leaves(outputs)
    whole_loss, whole_stats = loss_fn(whole_out, group, config)
    whole_loss.backward()

    split_out = _leaves(outputs)
    edges = [0, *bounds, batch["loss_mask"].shape[0]]
    losses, stats = [], []
    for start, stop in itertools.pairwise(edges):
        loss, s = loss_fn(
            slice_rows(split_out, start, stop), slice_rows(group, start, stop), config
        )
        losses.append(loss)
        stats.append(s)
    split_loss = torch.stack(losses).sum()
    split_loss.backward()

    torch.testing.assert_close(split_loss, whole_loss, **TOL)
    for key in ("logprobs", "values"):
        if key in whole_out:
            torch.testing.assert_close(split_out[key].grad, whole_out[key].grad, **TOL)
    combined = combine_stats(stats)
    assert combined.keys() == whole_stats.keys()
    for key, value in whole_stats.items():
        assert not value.requires_grad, key
        torch.testing.assert_close(combined[key], value, **TOL, equal_nan=True)


@pytest.fixture
def check_split() -> SplitCheck:
    """``check_split(loss_fn, outputs, batch, config, bounds)`` asserts split invariance."""
    return _check_split


@pytest.fixture
def random_online_batch() -> Callable[..., tuple[dict[str, Any], dict[str, Any]]]:
    """Build ``(outputs, rollout_batch)`` for an online algorithm: 6 rows in 2 prompt groups."""

    def build(seed: int = 0, rows: int = 6, length: int = 7) -> tuple[dict, dict]:
        gen = torch.Generator().manual_seed(seed)
        dt = torch.float64
        # Rows of different lengths, prompt first: row i has its last (i % 3) + 2 tokens trainable.
        mask = torch.zeros(rows, length, dtype=dt)
        for i in range(rows):
            mask[i, length - (i % 3) - 2 :] = 1.0
        old = -torch.rand(rows, length, generator=gen, dtype=dt) * 2.0
        new = old + 0.4 * torch.randn(rows, length, generator=gen, dtype=dt)
        batch = {
            "input_ids": torch.randint(0, 50, (rows, length), generator=gen),
            "loss_mask": mask,
            "old_logprobs": old,
            "ref_logprobs": old + 0.1 * torch.randn(rows, length, generator=gen, dtype=dt),
            "values": torch.randn(rows, length, generator=gen, dtype=dt),
            "rewards": torch.rand(rows, generator=gen, dtype=dt),
            "group_index": torch.arange(rows) % 2,
        }
        outputs = {
            "logprobs": new,
            "entropy": torch.rand(rows, length, generator=gen, dtype=dt),
            "values": batch["values"] + 0.7 * torch.randn(rows, length, generator=gen, dtype=dt),
        }
        return outputs, batch

    return build

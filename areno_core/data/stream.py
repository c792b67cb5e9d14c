"""Seeded, resumable iteration over dataset rows in batches and epochs."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

from areno_core.errors import DatasetError


class DataStream:
    """Yields batches of rows; each epoch is a fresh permutation seeded by ``seed`` and epoch.

    The position (``epoch``, ``offset``) is all the state there is, so resuming from a saved
    position continues with exactly the rows an uninterrupted run would have seen, across epoch
    boundaries too. The last batch of an epoch may be smaller than ``batch_size``.
    """

    def __init__(self, rows: Sequence[Any], batch_size: int, *, seed: int, epochs: int) -> None:
        if not rows:
            raise ValueError("DataStream needs at least one row")
        self.rows = rows
        self.batch_size = batch_size
        self.seed = seed
        self.epochs = epochs
        self.epoch = 0
        self.offset = 0
        self._order: list[int] | None = None

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.rows) / self.batch_size)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._order = torch.randperm(len(self.rows), generator=gen).tolist()
        return self._order

    def next_batch(self) -> list[Any] | None:
        """The next batch, or ``None`` when every epoch is done."""
        if self.epoch >= self.epochs:
            return None
        order = self._epoch_order()
        picked = order[self.offset : self.offset + self.batch_size]
        self.offset += len(picked)
        if self.offset >= len(order):
            self.epoch += 1
            self.offset = 0
            self._order = None
        return [self.rows[i] for i in picked]

    def batch_at(self, step: int) -> list[Any]:
        """The rows of step ``step`` (counted from the run's start), wherever the stream is."""
        if not 0 <= step < self.total_steps:
            raise ValueError(f"step {step} is outside the run's {self.total_steps} steps")
        other = copy.copy(self)
        other.epoch, batch = divmod(step, self.steps_per_epoch)
        other.offset = batch * self.batch_size
        other._order = None
        rows = other.next_batch()
        assert rows is not None
        return rows

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of the rows' content and order: the identity of the training data."""
        return rows_fingerprint(self.rows)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "num_rows": len(self.rows),
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("num_rows", len(self.rows)) != len(self.rows):
            raise DatasetError(
                f"the checkpoint was taken on a dataset of {state['num_rows']} rows, but this "
                f"run's dataset has {len(self.rows)}; resume with the same data"
            )
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self._order = None


def rows_fingerprint(rows: Sequence[Any]) -> str:
    """SHA-256 of the rows as canonical JSON (values JSON cannot hold are written as text)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()

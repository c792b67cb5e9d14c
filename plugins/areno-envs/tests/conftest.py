"""Fixtures for the environments pack's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Train and decode on one thread: the tiny models here gain nothing from two, and on a
    shared CPU two OpenMP threads that spin-wait for each other can run 20-50x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

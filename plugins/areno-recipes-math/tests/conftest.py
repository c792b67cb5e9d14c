"""Fixtures for the math pack's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Train and decode on one thread: the tiny models here gain nothing from two, and on a
    shared CPU two OpenMP threads that spin-wait for each other can run 20-50x slower."""

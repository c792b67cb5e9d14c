"""Fixtures for the tracker sinks' tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """The tiny model trains on one thread: on a shared CPU two spin-waiting OpenMP threads
    can be many times slower."""

"""The native engine passes the engine conformance suite (areno_core.engine_conformance)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from areno_core.engine_conformance import EngineConformance
from areno_core.rollout.native import NativeEngine


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class TestNativeEngineConformance(EngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return NativeEngine

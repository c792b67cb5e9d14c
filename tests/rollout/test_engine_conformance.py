"""The native engine passes the engine conformance suite (areno_core.engine_conformance)."""

from __future__ import annotations

import pytest

from areno_core.engine_conformance import EngineConformance
from areno_core.rollout.native import NativeEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class TestNativeEngineConformance(EngineConformance):
    @pytest.fixture
    def engine_factory(self):
        return NativeEngine

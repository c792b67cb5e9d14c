"""The sglang engine passes the engine conformance suite, against protocol servers."""

from __future__ import annotations

import pytest

from areno_core.engine_conformance import EngineConformance


class TestSGLangEngineConformance(EngineConformance):
    """One protocol server per engine, with other weights than the policy until synced."""

    @pytest.fixture
    def engine_factory(self, protocol_server, sglang_engine):
        def make(model, eos_token_ids, options):
            return sglang_engine(model, [protocol_server()], options=options, eos=eos_token_ids)

        return make

"""The sglang engine passes the engine conformance suite, against protocol servers: remote
(memory kept between sessions) and colocated (memory released after each session, the
weights discarded unless the server keeps a CPU backup, as SGLang's memory saver does)."""

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


class TestColocatedSGLangEngineConformance(EngineConformance):
    """Colocated: every session end releases the server's memory and discards the weights."""

    @pytest.fixture
    def engine_factory(self, protocol_server, colocated_engine):
        def make(model, eos_token_ids, options):
            return colocated_engine(model, protocol_server(), options=options, eos=eos_token_ids)

        return make


class TestColocatedWithCPUBackupConformance(EngineConformance):
    """Colocated with --enable-weights-cpu-backup: released weights come back by themselves."""

    @pytest.fixture
    def engine_factory(self, protocol_server, colocated_engine):
        def make(model, eos_token_ids, options):
            server = protocol_server(weights_cpu_backup=True)
            return colocated_engine(model, server, options=options, eos=eos_token_ids)

        return make

"""Fixtures for the areno-sglang tests: protocol servers (the CPU stand-in for SGLang) over tiny
random models, and engines connected to them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from areno_sglang.config import SGLangEngineConfig
from areno_sglang.engine import SGLangEngine
from areno_sglang.protocol_server import ProtocolServer

from areno_core.contracts.engine import EngineOptions
from areno_core.engine_conformance import EOS, conformance_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread: None) -> None:
    """Tiny matmuls are far faster on one thread than with threads fighting over two cores."""


@pytest.fixture
def protocol_server() -> Iterator[Callable[..., ProtocolServer]]:
    """``protocol_server(model=None, **server_options)``: a started server; by default over a
    conformance model with other weights than the policy's (seed 5), so only pushed weights
    make it agree. ``server_options`` go to :class:`ProtocolServer` (``api_key``,
    ``weights_cpu_backup``, ``dp_size``...)."""
    started: list[ProtocolServer] = []

    def start(model: torch.nn.Module | None = None, **server_options: Any) -> ProtocolServer:
        model = model if model is not None else conformance_model(5)
        server = ProtocolServer(model, **server_options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _engines(tmp_path: Path) -> tuple[Callable[..., SGLangEngine], list[SGLangEngine]]:
    """``build(engine_cls, policy, eos, options, **config)`` and the engines it built."""
    made: list[SGLangEngine] = []

    def build(
        engine_cls: type[SGLangEngine],
        policy: torch.nn.Module,
        eos: Any,
        options: EngineOptions | None,
        **config: Any,
    ) -> SGLangEngine:
        config.setdefault("sglang_weights_dir", str(tmp_path / "weights"))
        engine = engine_cls(
            policy,
            list(eos) if isinstance(eos, tuple | list) else eos,
            options or EngineOptions(attn_backend="native"),
            SGLangEngineConfig(**config),
            dp_rank=0,
            dp_size=1,
        )
        made.append(engine)
        return engine

    return build, made


@pytest.fixture
def sglang_engine(tmp_path: Path) -> Iterator[Callable[..., SGLangEngine]]:
    """``sglang_engine(policy, servers, **config)``: a remote-mode engine over ``servers``
    (protocol servers), ending completions at the conformance EOS (or ``eos``: ids or a
    tokenizer); closed after the test."""
    build, made = _engines(tmp_path)

    def make(
        policy: torch.nn.Module,
        servers: list[ProtocolServer],
        *,
        options: EngineOptions | None = None,
        eos: Any = (EOS,),
        **config: Any,
    ) -> SGLangEngine:
        url = ",".join(s.url for s in servers)
        return build(SGLangEngine, policy, eos, options, sglang_url=url, **config)

    yield make
    for engine in made:
        engine.close()


class InProcessColocated(SGLangEngine):
    """Colocated mode over an in-process protocol server instead of a launched process: the
    engine releases and resumes the server's memory around sessions as it would on a GPU, and
    the strict server discards released weights (unless it keeps a CPU backup)."""

    server: ProtocolServer

    def _launch(self, launch_module: str | None) -> str:
        return self.server.url


@pytest.fixture
def colocated_engine(tmp_path: Path) -> Iterator[Callable[..., SGLangEngine]]:
    """``colocated_engine(policy, server, eos=..., options=...)``: a colocated-mode engine
    (weights from disk) over ``server``; closed after the test."""
    build, made = _engines(tmp_path)

    def make(
        policy: torch.nn.Module,
        server: ProtocolServer,
        *,
        options: EngineOptions | None = None,
        eos: Any = (EOS,),
        **config: Any,
    ) -> SGLangEngine:
        config.setdefault("sglang_weight_sync", "disk")
        engine_cls = type("Colocated", (InProcessColocated,), {"server": server})
        return build(engine_cls, policy, eos, options, sglang_mode="colocated", **config)

    yield make
    for engine in made:
        engine.close()

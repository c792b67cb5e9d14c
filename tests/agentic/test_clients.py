"""Per-sample clients that share one TLS context (``ctx.openai_client``, ``ctx.http_client``)."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import httpx
import openai
import pytest

from areno_core.agentic import clients
from areno_core.agentic.types import AgentBatch, AgentContext, AgentItem, _may_isolate


def _item(url: str = "http://127.0.0.1:9/s/0-0/v1") -> AgentItem:
    return AgentItem(row={}, messages=(), prompt_index=0, sample_index=0, base_url=url)


@pytest.fixture
def certificate_loads(monkeypatch) -> list[Any]:
    """Every load of certificates into a TLS context (what makes a plain client costly)."""
    calls: list[Any] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self, *args: Any, **kwargs: Any) -> None:
        calls.append(args or kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    clients.shared_ssl_context.cache_clear()
    yield calls
    clients.shared_ssl_context.cache_clear()


def test_a_plain_client_loads_certificates_each_time_the_context_s_clients_once(
    certificate_loads,
) -> None:
    ctx = AgentContext(base_url="http://127.0.0.1:9/v1", api_key="k")

    async def make() -> None:
        for _ in range(3):
            async with openai.AsyncOpenAI(base_url=ctx.base_url, api_key="k"):
                pass
        plain = len(certificate_loads)
        for _ in range(5):
            async with ctx.openai_client(_item()):
                pass
            async with ctx.http_client():
                pass
        assert plain >= 3  # the premise: one load (or more) per plain client
        assert len(certificate_loads) == plain + 1  # the shared context, built once

    asyncio.run(make())


def test_openai_client_points_at_the_sample_and_passes_options_on() -> None:
    ctx = AgentContext(base_url="http://127.0.0.1:9/v1", api_key="secret")
    client = ctx.openai_client(_item(), max_retries=0, timeout=7.0)
    assert isinstance(client, openai.AsyncOpenAI)
    assert str(client.base_url) == "http://127.0.0.1:9/s/0-0/v1/"
    assert client.api_key == "secret" and client.max_retries == 0 and client.timeout == 7.0
    assert str(ctx.openai_client().base_url) == "http://127.0.0.1:9/v1/"  # the shared URL
    # The SDK's own defaults for the HTTP client (connection limits, redirects) are kept.
    assert isinstance(client._client, openai.DefaultAsyncHttpxClient)
    assert client._client.follow_redirects
    http = ctx.http_client(timeout=3.0)
    assert isinstance(http, httpx.AsyncClient) and http.timeout.read == 3.0
    assert clients.shared_ssl_context().verify_mode == ssl.CERT_REQUIRED  # still verifying


def test_closing_one_sample_s_client_leaves_the_next_one_working() -> None:
    ctx = AgentContext(base_url="http://127.0.0.1:9/v1", api_key="k")

    async def twice() -> None:
        first = ctx.openai_client(_item())
        async with first:
            pass
        assert first.is_closed()
        second = ctx.openai_client(_item())
        assert not second.is_closed()
        await second.close()

    asyncio.run(twice())


def test_a_sample_that_makes_its_client_from_the_context_still_runs_isolated() -> None:
    ctx = AgentContext(base_url="http://127.0.0.1:9/v1", api_key="k")

    async def play(item: AgentItem) -> None:
        async with ctx.openai_client(item):
            pass

    assert _may_isolate(play)
    batch = AgentBatch(items=(_item(),), n_samples=1)
    assert len(asyncio.run(ctx.run_each(batch, play))) == 1

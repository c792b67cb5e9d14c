"""Clients for a sample's endpoint that cost little to make.

An agent that runs its samples on event loops of their own (``ctx.run_each``) makes a client per
sample. A plain ``openai.AsyncOpenAI(...)`` builds an ``httpx`` client, which builds a TLS
context and loads the system's certificates into it: about 50 ms of CPU time on a 2-core
machine, for an endpoint on ``http://127.0.0.1`` that never uses TLS, and about half of what
an agentic sample costs the rollout process in ``bench/bench_agentic_overlap.py``. The clients
made here share one TLS context, built once per process, the same one ``httpx`` builds for
each of its clients (certificate verification as it would be); making one then costs about
0.5 ms. An ``ssl.SSLContext`` may be shared between threads and event loops: it holds
settings and certificates, not connections.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """The TLS context ``httpx`` gives a client by default, built once per process."""
    import httpx  # a dependency of openai, needed only by agents

    return httpx.create_ssl_context()


def http_client(**kwargs: Any) -> Any:
    """A new ``httpx.AsyncClient`` (with the OpenAI SDK's defaults when it is installed:
    timeouts, connection limits, redirects) on the shared TLS context; ``kwargs`` go to it."""
    kwargs.setdefault("verify", shared_ssl_context())
    try:
        import openai  # 1-2 s to import: only when an agent makes a client
    except ImportError:
        import httpx  # without openai, a framework's own client on plain httpx

        return httpx.AsyncClient(**kwargs)
    return openai.DefaultAsyncHttpxClient(**kwargs)


def openai_client(base_url: str, api_key: str, **kwargs: Any) -> Any:
    """A new ``openai.AsyncOpenAI`` for ``base_url`` on its own ``httpx`` client made by
    :func:`http_client` (closing it closes that client); ``kwargs`` go to ``AsyncOpenAI``."""
    import openai  # 1-2 s to import: only when an agent makes a client

    kwargs.setdefault("http_client", http_client())
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, **kwargs)


__all__ = ["http_client", "openai_client", "shared_ssl_context"]

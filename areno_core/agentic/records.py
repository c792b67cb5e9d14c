"""What the agent endpoint served: one record per response, kept by the server.

Training rows are built from these records (:mod:`areno_core.agentic.trajectory`), never from
the copy of the token data an agent hands back, so an agent cannot make the trainer learn
tokens the policy did not sample in the context it sampled them in. This module has no heavy
imports, so the trajectory code can use the record types without loading the HTTP stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class ServedChoice:
    """One choice the endpoint returned, with everything needed to rebuild its token row."""

    index: int
    message: Mapping[str, Any]
    finish_reason: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    engine_finish_reason: str
    prompt_spans: tuple[Mapping[str, Any], ...] = ()
    prefix_reused: bool = False
    policy_version: int = 0

    def extension(self) -> dict[str, Any]:
        """The ``areno`` field of the choice in the response (see docs/agentic.md)."""
        return {
            "prompt_token_ids": list(self.prompt_token_ids),
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "finish_reason": self.engine_finish_reason,
            "prompt_spans": [dict(s) for s in self.prompt_spans],
            "prefix_reused": self.prefix_reused,
            "policy_version": self.policy_version,
        }


@attrs.frozen
class ServedCompletion:
    """One ``chat.completion`` response and the request it answered (as the template saw
    it: ``messages`` and ``tools`` after normalisation)."""

    id: str
    created: int
    model: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    choices: tuple[ServedChoice, ...]
    sample: tuple[int, int] | None = None
    """The sample whose URL the request came through (``AgentItem.key``); None for the
    shared URL."""


__all__ = ["ServedChoice", "ServedCompletion"]

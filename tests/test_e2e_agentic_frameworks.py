"""Agents written with real agent frameworks train unchanged under ``areno train``.

``examples/agentic/frameworks/`` holds a tic-tac-toe player written with the OpenAI Agents SDK
(returns a reward per sample), one written with LangGraph + ``langchain-openai`` (returns
nothing; the recipe's reward function scores the final conversation) and one written with
smolagents (synchronous, streaming, returns a reward). Each plays a multi-turn tool-calling
episode (a ``choose_square`` call, the tool's result, the model's next reply) against the
sample's own URL. The frameworks come from the ``agents`` extra, which
``scripts/dev.sh test`` installs; their tracing is off (nothing leaves the machine).

The check: every row areno trains on is made of exactly what the endpoint served to that sample
(the row is a served prompt followed by its sampled tokens; the trained positions are the
sampled tokens of the choices on that conversation, with their logprobs), and every sampled
token served to a sample is trained exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from areno_core.agentic.records import ServedCompletion
from areno_core.testing import run_areno

REPO = Path(__file__).resolve().parent.parent
FRAMEWORKS = REPO / "examples" / "agentic" / "frameworks"

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


@pytest.fixture
def captured(
    monkeypatch: pytest.MonkeyPatch, agentic_steps: list[tuple[Any, list[Any]]]
) -> list[tuple[Any, list[Any]]]:
    """``(server, groups)`` of every agentic step of the run, with the frameworks' tracing off."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    monkeypatch.setenv("LANGCHAIN_TRACING_V2", "false")
    return agentic_steps


def _check_rows_are_served_tokens(records: dict[str, ServedCompletion], groups: list[Any]) -> int:
    """Assert the rows of ``groups`` are exactly the sampled tokens ``records`` hold; returns
    how many served choices were checked."""
    served: dict[tuple[int, int], list[Any]] = {}
    for record in records.values():
        assert record.sample is not None, "every request came through a sample's own URL"
        served.setdefault(record.sample, []).extend(record.choices)
    trained: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    for group in groups:
        for row in group.trajectories:
            key = (row.prompt_index, row.sample_index)
            choices = served[key]
            row_ids = tuple(row.input_ids)
            leaf = [c for c in choices if (*c.prompt_token_ids, *c.token_ids) == row_ids]
            assert leaf, f"row of sample {key} is not a served prompt followed by its tokens"
            positions = [i for i, m in enumerate(row.loss_mask) if m]
            for choice in choices:
                start, end = (
                    len(choice.prompt_token_ids),
                    len(choice.prompt_token_ids) + len(choice.token_ids),
                )
                if tuple(row.input_ids[:end]) != (*choice.prompt_token_ids, *choice.token_ids):
                    continue
                span = [p for p in positions if start <= p < end]
                if span:
                    assert span == list(range(start, end))
                    assert tuple(row.rollout_logprobs[start:end]) == choice.logprobs
                    trained.setdefault(key, []).append(choice.token_ids)
                    positions = [p for p in positions if not start <= p < end]
            assert positions == [], f"sample {key} trains tokens the endpoint did not sample"
    for key, choices in served.items():
        assert sorted(trained.get(key, [])) == sorted(c.token_ids for c in choices), key
    return sum(len(c) for c in served.values())


@pytest.mark.parametrize(
    ("agent", "reward_source"),
    [("openai_agents_tictactoe.py", "agent"), ("langgraph_tictactoe.py", "reward_fn")],
)
def test_framework_agent_trains_on_exactly_the_served_tokens(
    tmp_path: Path, captured: list[tuple[Any, list[Any]]], agent: str, reward_source: str
) -> None:
    run = tmp_path / "run"
    run_areno(
        "train", "--recipe", "agentic/tictactoe-cpu", "--algo", "grpo",
        "--agent-fn", str(FRAMEWORKS / agent), "--max-prompt-tokens", "1024",
        "--batch-size", "2", "--n-samples", "2", "--mini-bs", "4", "--max-steps", "1",
        "--save-path", str(run),
    )  # fmt: skip
    assert len(captured) == 1
    server, groups = captured[0]
    assert _check_rows_are_served_tokens(dict(server.records), groups) >= 8
    rows = [t for g in groups for t in g.trajectories]
    assert len(rows) == 4
    for row in rows:
        assert row.metadata["turns"] >= 2  # the move, the tool's answer, the model's reply
        assert row.metadata["tool_calls"] >= 1
        assert row.metadata["reward_source"] == reward_source
    (step,) = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    assert step["rollout/agent_errors"] == 0 and step["rollout/agent_mismatches"] == 0
    assert step["rollout/agent_branches"] == 0  # the framework re-sent the history verbatim
    assert step["rollout/agent_requests"] >= 8
    assert step["train/target_tokens"] == sum(sum(t.loss_mask) for t in rows)


def test_smolagents_agent_trains_on_exactly_the_served_tokens(
    tmp_path: Path, captured: list[tuple[Any, list[Any]]]
) -> None:
    """smolagents' ToolCallingAgent, synchronous and streaming, resends its history as text:
    each request after a tool call is a conversation of its own, and the rows are still exactly
    the served tokens, each trained once, all with the sample's reward."""
    run = tmp_path / "run"
    run_areno(
        "train", "--recipe", "agentic/tictactoe-cpu", "--algo", "grpo", "--temperature", "0.3",
        "--agent-fn", str(FRAMEWORKS / "smolagents_tictactoe.py"), "--max-prompt-tokens", "1024",
        "--batch-size", "2", "--n-samples", "2", "--mini-bs", "4", "--max-steps", "1",
        "--save-path", str(run),
    )  # fmt: skip
    (server, groups) = captured[0]
    records = dict(server.records)
    assert _check_rows_are_served_tokens(records, groups) >= 8
    requests: dict[tuple[int, int], list[Any]] = {}
    for record in records.values():
        requests.setdefault(record.sample, []).append(record)
    assert sorted(requests) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    observed = 0
    for served in requests.values():
        assert len(served) >= 2  # a call, then smolagents' feedback and the next call
        later = " ".join(str(m.get("content")) for r in served[1:] for m in r.messages)
        observed += "Observation:" in later  # the tool ran and its result went back
    assert observed >= 1
    rows = [t for g in groups for t in g.trajectories]
    assert {row.metadata["reward_source"] for row in rows} == {"agent"}
    (step,) = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    assert step["rollout/agent_errors"] == 0 and step["rollout/agent_mismatches"] == 0
    assert step["rollout/agent_branches"] == len(rows) - 4 >= observed
    assert step["rollout/tool_calls_mean"] > 0
    assert step["train/target_tokens"] == sum(sum(t.loss_mask) for t in rows)

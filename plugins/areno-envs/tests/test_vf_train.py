"""verifiers environments train under ``areno train`` through the ``vf`` loader, reward and agent.

Two tasksets written in ``vf_envs/`` against the real ``verifiers.v1`` API: ``vf_sums``
(single-turn, two weighted ``@vf.reward`` methods) and ``vf_tictactoe`` (multi-turn: a
``vf.Toolset`` with a ``choose_square`` tool, the rubric reading the first call). Each trains
for two steps; the checks recompute every reward from what the run sampled and check that the
multi-turn rows are exactly what the endpoint served.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import areno_core.rewards as rewards_module
from areno_core.recipe import resolve_resource
from areno_core.testing import run_areno

HERE = Path(__file__).resolve().parent
TICTACTOE_WARMSTART = "resource:areno_recipes_agentic/checkpoints/tictactoe-sft"

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


@pytest.fixture(autouse=True)
def _vf_envs_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test tasksets are importable by their ids, as an installed package is."""
    monkeypatch.syspath_prepend(str(HERE / "vf_envs"))


@pytest.fixture
def scored(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, float]]:
    """``(record, reward)`` of every sample the run scored."""
    out: list[tuple[Any, float]] = []
    real = rewards_module.RewardScorer.score

    def score(self: Any, records: Any) -> Any:
        rewards, errors = real(self, records)
        out.extend(zip(records, rewards, strict=True))
        return rewards, errors

    monkeypatch.setattr(rewards_module.RewardScorer, "score", score)
    return out


def _spec(path: Path, **row: Any) -> Path:
    path.write_text(json.dumps(row) + "\n")
    return path


def _steps(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]


def test_single_turn_taskset_trains_with_its_rubric(tmp_path: Path, scored: list) -> None:
    from vf_sums import SumConfig, SumTaskset  # the test taskset, on sys.path by the fixture

    # the taskset's options from the spec row and from --env-args (laid over the row's)
    spec = _spec(tmp_path / "sums.jsonl", taskset="vf_sums", config={"count": 4, "largest": 9})
    run = tmp_path / "run"
    run_areno(
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(spec),
        "--env-args", '{"largest": 5}',
        "--dataset-loader-fn", "vf", "--reward-fn-path", "vf", "--batch-size", "2",
        "--n-samples", "2", "--mini-bs", "4", "--gradient-accumulation-steps", "1",
        "--max-new-tokens", "6", "--max-steps", "2", "--no-activation-checkpointing",
        "--save-path", str(run),
    )  # fmt: skip
    tasks = {t.data.prompt: t.data for t in SumTaskset(SumConfig(id="vf_sums", count=4, largest=5))}
    assert len(scored) == 8  # 2 steps x 2 prompts x 2 samples
    for record, reward in scored:
        data = tasks[record.row["prompt"][-1]["content"]]
        assert record.row["prompt"][0] == {"role": "system", "content": "Answer with the number."}
        reply = record.completion.strip()
        expected = (1.0 if str(data.a + data.b) in reply else 0.0) + 0.5 * (len(reply) <= 6)
        assert reward == expected, (reply, reward)
    steps = _steps(run)
    assert [s["step"] for s in steps] == [1, 2]
    for step, chunk in zip(steps, (scored[:4], scored[4:]), strict=True):
        assert step["rollout/reward_errors"] == 0
        assert step["rollout/reward_mean"] == pytest.approx(sum(r for _, r in chunk) / 4)


def test_multi_turn_tool_taskset_trains_through_the_endpoint(
    tmp_path: Path, scored: list, agentic_steps: list
) -> None:
    from vf_tictactoe import BOARDS  # the test taskset, on sys.path by the fixture

    spec = _spec(tmp_path / "ttt.jsonl", taskset="vf_tictactoe", max_turns=2,
                 tool_choice="choose_square")  # fmt: skip
    run = tmp_path / "run"
    ckpt = resolve_resource(TICTACTOE_WARMSTART)
    run_areno(
        "train", "--algo", "grpo", "--ckpt", ckpt, "--dataset-path", str(spec),
        "--dataset-loader-fn", "vf", "--reward-fn-path", "vf", "--agent-fn", "vf",
        "--batch-size", "2", "--n-samples", "2", "--mini-bs", "4",
        "--gradient-accumulation-steps", "1", "--max-new-tokens", "24",
        "--max-prompt-tokens", "1024", "--max-steps", "2", "--no-activation-checkpointing",
        "--save-path", str(run),
    )  # fmt: skip
    optimal = {f"{b}": o for b, _, o in BOARDS}
    assert len(scored) == 8
    for record, reward in scored:
        board = record.row["vf"]["data"]["board"]
        assert record.messages[: len(record.row["prompt"])] == record.row["prompt"]
        calls = [c for m in record.messages if m["role"] == "assistant"
                 for c in m.get("tool_calls") or []]  # fmt: skip
        assert calls, "the first request forces a choose_square call"
        first = calls[0]["function"]
        assert first["name"] == "choose_square"
        try:
            square = int(json.loads(first["arguments"])["square"])
        except (ValueError, KeyError, TypeError):
            square = None
        free = [i + 1 for i, m in enumerate(board) if m == "."]
        expected = 1.0 if square in optimal[board] else 0.5 if square in free else 0.0
        assert reward == expected
        # the tool's answer went back to the model
        assert any(m["role"] == "tool" and m["content"] == f"You marked square {square}."
                   for m in record.messages) or square is None  # fmt: skip
    assert len(agentic_steps) == 2
    for server, groups in agentic_steps:
        records = dict(server.records)
        choices: dict[tuple[int, int], list[Any]] = {}
        for rec in records.values():
            assert rec.sample is not None
            choices.setdefault(rec.sample, []).extend(rec.choices)
        rows = [t for g in groups for t in g.trajectories]
        assert len(rows) == 4
        for row in rows:
            assert row.metadata["turns"] >= 2 and row.metadata["tool_calls"] >= 1
            sample = choices[(row.prompt_index, row.sample_index)]
            served_ids = [(*c.prompt_token_ids, *c.token_ids) for c in sample]
            assert tuple(row.input_ids) in served_ids, "each row is a served prompt + its tokens"
            assert sum(row.loss_mask) > 0
    for step in _steps(run):
        assert step["rollout/agent_errors"] == 0 and step["rollout/agent_mismatches"] == 0
        assert step["rollout/reward_errors"] == 0

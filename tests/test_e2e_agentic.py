"""An agentic recipe trains end to end on CPU through the local OpenAI-compatible endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areno_core.cli.main import main

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


# agentic/duelgrid-cpu is not trained here: the smoke matrix of scripts/dev.sh test trains it
# (with gspo and grpo) and its recipe gates what this test checked (samples, agent requests
# and errors, turns, target tokens), so CI trains its slowest agentic case once per algorithm.
def test_agentic_tictactoe_recipe_trains_through_endpoint(tmp_path: Path):
    run = tmp_path / "run"
    try:
        # 4 positions x 4 samples a step instead of the recipe's 16 x 8 (the CI's tic-tac-toe
        # gate trains the full batch for 60 steps): the same path with 8x fewer turns
        main(["train", "--recipe", "agentic/tictactoe-cpu", "--algo", "grpo", "--max-steps", "2",
              "--batch-size", "4", "--n-samples", "4", "--mini-bs", "16",
              "--save-path", str(run)])  # fmt: skip
    except SystemExit as exc:
        assert exc.code in (0, None)
    steps = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        assert step["rollout/agent_requests"] >= step["rollout/samples"] == 16
        assert step["rollout/agent_errors"] == 0
        assert 0.0 <= step["rollout/reward_mean"] <= 1.0
        assert step["train/target_tokens"] > 0
        # The shipped warm start calls the tool, so rewards differ within groups and a
        # gradient flows through the agentic path (a random model's rewards are all 0).
        assert step["rollout/tool_calls_mean"] > 0.9
        assert step["rollout/reward_std"] > 0.0
        assert step["train/grad_norm"] > 0.0
        assert step["rollout/agent_mismatches"] == 0
    assert (run / "latest").read_text().strip() == "step_2"
    assert (run / "step_2" / "model.safetensors").is_file()

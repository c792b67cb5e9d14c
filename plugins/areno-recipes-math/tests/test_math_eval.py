"""``areno eval --recipe math/arith`` reproduces what training logged as eval/accuracy, through
the pack's registered evaluator, for full checkpoints and LoRA adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from areno_recipes_math.evaluate import EVALUATORS
from areno_recipes_math.recipes import ARITH_EVAL

from areno_core.metrics.logger import read_jsonl
from areno_core.registry import get_registry
from areno_core.testing import run_areno

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

# The metrics of `areno eval` that training logs under eval/* for the same greedy pass.
SAME = {
    "accuracy": "eval/accuracy",
    "reward_mean": "eval/reward_mean",
    "response_length_mean": "eval/response_length_mean",
    "truncation_rate": "eval/truncation_rate",
}


def evaluated(run: Path, out: Path, *ckpts: str, extra: tuple[str, ...] = ()) -> list[dict]:
    args = [arg for ckpt in ckpts for arg in ("--ckpt", ckpt)]
    run_areno("eval", "--recipe", "math/arith", *args, "--output", str(out), *extra)
    return json.loads(out.read_text())["results"]


def logged_evals(run: Path) -> dict[int, dict]:
    return {row["step"]: row for row in read_jsonl(run / "tensorboard") if "eval/accuracy" in row}


def test_pack_registers_its_evaluators_for_its_recipes() -> None:
    registry = get_registry()
    assert registry.evaluator("math/arith") is EVALUATORS[0]
    assert registry.evaluator("math/arith").dataset == ARITH_EVAL
    assert registry.evaluator("math/gsm8k").reward == "math_verify"


def test_eval_of_each_step_reproduces_the_accuracy_training_logged(tmp_path) -> None:
    run = tmp_path / "gspo"
    run_areno("train", "--recipe", "math/arith", "--algo", "gspo", "--max-steps", "2",
              "--batch-size", "8", "--eval-limit", "100", "--eval-interval", "1",
              "--save-interval", "1", "--save-path", str(run))  # fmt: skip
    logged = logged_evals(run)
    assert sorted(logged) == [0, 1, 2]
    results = evaluated(run, tmp_path / "eval.json", str(run), extra=("--limit", "100"))
    assert [r["step"] for r in results] == [1, 2]  # the run directory: each step_N in order
    for result in results:
        row = logged[result["step"]]
        for ours, theirs in SAME.items():
            assert result["metrics"][ours] == pytest.approx(row[theirs], abs=1e-12), ours
        assert result["metrics"]["prompts"] == 100.0


def test_eval_of_a_lora_adapter_matches_training_and_its_merged_export(tmp_path) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")
    run = tmp_path / "gspo-lora"
    run_areno("train", "--recipe", "math/arith", "--algo", "gspo", "--lora-rank", "16",
              "--lr", "1e-2", "--max-steps", "1", "--batch-size", "8", "--eval-limit", "100",
              "--save-merged", "--save-path", str(run))  # fmt: skip
    step = run / "step_1"
    assert (step / "adapter_config.json").is_file()
    adapter, merged = evaluated(
        run, tmp_path / "eval.json", str(step), str(step / "merged"), extra=("--limit", "100")
    )
    logged = logged_evals(run)
    # lr 1e-2 moves the adapted policy within one step, so a loader that dropped the adapter
    # (and scored the base) would not match
    assert logged[1]["eval/accuracy"] != logged[0]["eval/accuracy"]
    assert adapter["metrics"]["accuracy"] == pytest.approx(logged[1]["eval/accuracy"])
    for key in SAME:
        assert adapter["metrics"][key] == pytest.approx(merged["metrics"][key], abs=1e-12)

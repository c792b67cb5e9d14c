"""Validation gates on hand-made metrics histories and checkpoint directories."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from areno_core.gates import check_run, evaluate_gate, evaluate_gates, recipe_gates
from areno_core.metrics.logger import MetricsLogger
from areno_core.recipe import Gate, Recipe
from areno_core.train.checkpoint import TRAINER_STATE_FILE, WEIGHTS_FILE, save_checkpoint

HISTORY = [
    {"step": 1, "train/loss": 2.0, "rollout/reward_mean": 0.10, "train/grad_norm": 1.0},
    {"step": 2, "train/loss": 1.6, "rollout/reward_mean": 0.20, "train/grad_norm": 0.9},
    {"step": 3, "train/loss": 1.5, "rollout/reward_mean": 0.30, "train/grad_norm": 0.8},
    {"step": 4, "train/loss": 1.1, "rollout/reward_mean": 0.40, "train/grad_norm": 0.7},
    {"step": 5, "train/loss": 0.9, "rollout/reward_mean": 0.50, "train/grad_norm": 0.6},
    {"step": 6, "train/loss": 0.8, "rollout/reward_mean": 0.60, "train/grad_norm": 0.5},
]


def check(gate: Gate, history=HISTORY):  # type: ignore[no-untyped-def]
    return evaluate_gate(gate, history)


# -- metric gates --------------------------------------------------------------------------


def test_gate_metric_exists_logged_passes():
    result = check(Gate("metric_exists", "train/loss"))
    assert result.passed and result.observed == 0.8 and "6 value(s)" in result.reason


def test_gate_metric_exists_missing_fails_suggesting_renamed_metric():
    result = check(Gate("metric_exists", "train/losss"))
    assert not result.passed
    assert "train/losss was not logged" in result.reason and "train/loss" in result.reason


def test_gate_metric_exists_before_window_only_fails():
    history = [{"step": 1, "eval/acc": 0.5}, {"step": 2}]
    result = check(Gate("metric_exists", "eval/acc", after_step=2), history)
    assert not result.passed and "not logged at steps >= 2" in result.reason


def test_gate_on_empty_history_fails_saying_nothing_was_logged():
    result = check(Gate("finite", "train/loss"), [])
    assert not result.passed and "logged no metrics at all" in result.reason


def test_gate_finite_all_finite_passes():
    assert check(Gate("finite", "train/grad_norm")).passed


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_gate_finite_non_finite_value_fails_naming_step(bad):
    history = [dict(row) for row in HISTORY]
    history[2]["train/grad_norm"] = bad
    result = check(Gate("finite", "train/grad_norm"), history)
    assert not result.passed
    assert f"train/grad_norm is {bad} at step 3" in result.reason


def test_gate_finite_ignores_bad_value_before_window():
    history = [dict(row) for row in HISTORY]
    history[0]["train/loss"] = math.nan
    assert not check(Gate("finite", "train/loss"), history).passed
    assert check(Gate("finite", "train/loss", after_step=2), history).passed


def test_gate_at_least_uses_last_value_without_after_step():
    passed = check(Gate("at_least", "rollout/reward_mean", threshold=0.6))
    failed = check(Gate("at_least", "rollout/reward_mean", threshold=0.61))
    assert passed.passed and passed.observed == 0.6
    assert not failed.passed
    assert "last rollout/reward_mean (step 6) = 0.6 < 0.61" in failed.reason


def test_gate_at_least_after_step_uses_window_mean():
    gate = Gate("at_least", "rollout/reward_mean", threshold=0.5, after_step=4)
    result = check(gate)  # mean of 0.4, 0.5, 0.6
    assert result.passed and result.observed == pytest.approx(0.5)
    result = check(Gate("at_least", "rollout/reward_mean", threshold=0.4, after_step=1))
    assert not result.passed and result.observed == pytest.approx(0.35)
    assert "mean rollout/reward_mean over 6 step(s) >= 1 = 0.35 < 0.4" in result.reason


def test_gate_at_most_passes_and_fails_with_reason():
    assert check(Gate("at_most", "train/loss", threshold=1.0)).passed
    result = check(Gate("at_most", "train/loss", threshold=1.0, after_step=3))
    assert not result.passed  # mean of 1.5, 1.1, 0.9, 0.8 = 1.075
    assert result.observed == pytest.approx(1.075) and "> 1" in result.reason


def test_gate_threshold_on_nan_mean_fails():
    history = [{"step": 1, "train/loss": math.nan}]
    result = check(Gate("at_most", "train/loss", threshold=10.0), history)
    assert not result.passed and "nan" in result.reason


def test_gate_rises_passes_on_rising_metric_and_fails_on_falling():
    rises = check(Gate("rises", "rollout/reward_mean", threshold=0.3))
    assert rises.passed and rises.observed == pytest.approx(0.4)  # 0.55 - 0.15
    result = check(Gate("rises", "train/loss"))
    assert not result.passed
    assert "mean of first 2 = 1.8, of last 2 = 0.85" in result.reason
    assert "needs to rise by more than 0" in result.reason


def test_gate_rises_needs_margin_beyond_threshold():
    result = check(Gate("rises", "rollout/reward_mean", threshold=0.5))
    assert not result.passed and "needs to rise by more than 0.5" in result.reason


def test_gate_falls_passes_on_falling_loss_and_fails_on_rising_reward():
    assert check(Gate("falls", "train/loss", threshold=0.5)).passed
    assert not check(Gate("falls", "rollout/reward_mean")).passed


def test_gate_trend_with_one_value_fails():
    result = check(Gate("rises", "train/loss", after_step=6))
    assert not result.passed and "needs two or more values" in result.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "at_least", "metric": "train/loss"}, "needs a threshold"),
        ({"kind": "finite"}, "needs a metric name"),
        ({"kind": "checkpoint_loadable", "metric": "train/loss"}, "takes no metric"),
        ({"kind": "bigger", "metric": "x"}, "unknown gate kind 'bigger'"),
        ({"kind": "rises", "metric": "x", "threshold": -1.0}, "must be >= 0"),
        ({"kind": "at_most", "metric": "x", "threshold": math.inf}, "must be finite"),
        ({"kind": "finite", "metric": "x", "after_step": -1}, "zero or more"),
    ],
)
def test_gate_invalid_definition_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Gate(**kwargs)


def test_gate_report_summarises_and_lists_failures():
    report = evaluate_gates(
        [Gate("finite", "train/loss"), Gate("at_least", "train/loss", threshold=5.0)], HISTORY
    )
    assert not report.passed and report.summary() == "1/2 gates passed"
    assert [r.gate.kind for r in report.failures] == ["at_least"]


# -- checkpoints ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    from areno_core.models.loading import load_model_and_tokenizer

    root = tmp_path_factory.mktemp("run")
    model, tokenizer = load_model_and_tokenizer("random:qwen3-tiny")
    for step in (2, 4):
        save_checkpoint(
            root, step, model=model, tokenizer=tokenizer, optimizer=None, scheduler=None,
            trainer_state={"epoch": 0}, config={"basic": {"algo": "sft"}},
        )  # fmt: skip
    return root


@pytest.fixture
def run_copy(saved_run, tmp_path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(saved_run, target)
    return target


def test_gate_checkpoint_loadable_latest_checkpoint_passes(run_copy):
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=run_copy)
    assert result.passed and result.observed == 4.0
    assert "step_4 loads and gives finite logits" in result.reason


def test_gate_checkpoint_loadable_accepts_checkpoint_dir_itself(run_copy):
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=run_copy / "step_2")
    assert result.passed and result.observed == 2.0


def test_gate_checkpoint_loadable_no_checkpoint_fails(tmp_path):
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=tmp_path)
    assert not result.passed and f"no checkpoint under {tmp_path}" in result.reason
    missing = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=tmp_path / "nope")
    assert not missing.passed and "no run directory" in missing.reason


def test_gate_checkpoint_loadable_incomplete_checkpoint_fails_naming_file(run_copy):
    for step in ("step_2", "step_4"):
        (run_copy / step / TRAINER_STATE_FILE).unlink()
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=run_copy)
    assert not result.passed
    assert "step_4 is incomplete: trainer_state.pt is missing" in result.reason


def test_gate_checkpoint_loadable_corrupt_weights_fail_to_load(run_copy):
    weights = run_copy / "step_4" / WEIGHTS_FILE
    weights.write_bytes(b"\0" * weights.stat().st_size)  # same size: the manifest still agrees
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=run_copy)
    assert not result.passed and "step_4 does not load" in result.reason


def test_gate_checkpoint_loadable_nan_weights_fail(tmp_path):
    from areno_core.models.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("random:qwen3-tiny")
    with torch.no_grad():
        model.get_input_embeddings().weight.fill_(math.nan)
    save_checkpoint(
        tmp_path, 1, model=model, tokenizer=tokenizer, optimizer=None, scheduler=None,
        trainer_state={}, config={},
    )  # fmt: skip
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=tmp_path)
    assert not result.passed and "logits are not finite" in result.reason


def test_gate_checkpoint_loadable_too_early_fails(run_copy):
    result = evaluate_gate(Gate("checkpoint_loadable", after_step=10), [], checkpoint_root=run_copy)
    assert not result.passed and "step_4 is before step 10" in result.reason


# -- whole runs ----------------------------------------------------------------------------


def test_check_run_reads_metrics_jsonl_and_adds_expected_metrics(run_copy):
    with MetricsLogger(run_copy / "tensorboard") as metrics:
        for row in HISTORY:
            metrics.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
        metrics.log({"train/loss": math.nan}, step=7)
    recipe = Recipe(
        name="pack/demo",
        summary="demo",
        algorithms=("sft",),
        expected_metrics={"train/loss": "loss", "train/lr": "learning rate"},
        gates=(Gate("finite", "train/loss"), Gate("checkpoint_loadable")),
    )
    gates = recipe_gates(recipe)
    assert [g.kind for g in gates] == ["finite", "checkpoint_loadable", "metric_exists"]
    report = check_run(recipe, run_copy)
    by_kind = {r.gate.kind: r for r in report.results}
    assert not by_kind["finite"].passed and "nan at step 7" in by_kind["finite"].reason
    assert by_kind["checkpoint_loadable"].passed
    assert not by_kind["metric_exists"].passed and "train/lr" in by_kind["metric_exists"].reason


def test_check_run_follows_custom_metrics_log_dir(tmp_path):
    custom = tmp_path / "elsewhere"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"observability:\n  metrics_log_dir: {custom}\n")
    with MetricsLogger(custom) as metrics:
        metrics.log({"train/loss": 1.0}, step=1)
    report = check_run([Gate("metric_exists", "train/loss")], run)
    assert report.passed

"""`areno train --ckpt DIR` on a tiny checkpoint of every model family, as a new user runs it.

GRPO for two steps on every family (its step-1 importance ratios must be 1: the rollout
engine's log-probabilities are the training forward's), and the saved checkpoint loads back
with ``from_pretrained``; SFT, DPO and LoRA GRPO for two steps each. Runs are in-process and
take 1-3 s each here (about 50 s for the 40 of them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from areno_core.models.families import available_families, family
from areno_core.models.lora import resolve_target_modules
from areno_core.testing import run_areno

pytestmark = pytest.mark.usefixtures("installed_plugins_only", "no_deprecated_transformers_api")

REPO = Path(__file__).resolve().parent.parent
SFT_LOADER = REPO / "examples" / "sft" / "gsm8k_sft_loader.py"
NAMES = [f.name for f in available_families()]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, write_rl_files, write_dpo_loader) -> Path:
    folder = tmp_path_factory.mktemp("family-data")
    with (REPO / "data" / "gsm8k" / "train.jsonl").open() as f:
        (folder / "rows.jsonl").write_text("".join(next(f) for _ in range(16)))
    write_rl_files(folder, 24)
    write_dpo_loader(folder, 24)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family-ckpts")
    return {name: family(name).save(root / name) for name in NAMES}


def base_args(ckpt: Path, data: Path, run: Path) -> list[str]:
    return [
        "train", "--ckpt", str(ckpt), "--dataset-path", str(data / "rows.jsonl"),
        "--max-steps", "2", "--save-path", str(run), "--seed", "1", "--lr", "1e-3",
        "--no-activation-checkpointing",
    ]  # fmt: skip


def grpo_args(ckpt: Path, data: Path, run: Path) -> list[str]:
    # One optimizer step per trainer step, so step 1 scores every row before any update.
    return [
        *base_args(ckpt, data, run), "--algo", "grpo", "--dataset-loader-fn",
        str(data / "rl_loader.py"), "--reward-fn-path", str(data / "reward.py"),
        "--batch-size", "2", "--n-samples", "4", "--mini-bs", "8", "--max-new-tokens", "16",
    ]  # fmt: skip


def history(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    return [r for r in rows if "train/loss" in r]


def assert_trained_two_finite_steps(run: Path) -> list[dict]:
    steps = history(run)
    assert len(steps) == 2
    assert all(torch.isfinite(torch.tensor(s["train/loss"])) for s in steps)
    return steps


@pytest.mark.parametrize("name", NAMES)
def test_family_grpo_two_steps_step_one_ratio_is_one_and_checkpoint_reloads(
    tmp_path, data, checkpoints, name
) -> None:
    run = tmp_path / "run"
    run_areno(*grpo_args(checkpoints[name], data, run))
    first = assert_trained_two_finite_steps(run)[0]
    assert abs(first["train/ratio_max"] - 1.0) <= 2e-5, first["train/ratio_max"]
    assert abs(first["train/ratio_min"] - 1.0) <= 2e-5, first["train/ratio_min"]
    reloaded = AutoModelForCausalLM.from_pretrained(run / "step_2")
    assert type(reloaded).__name__ == family(name).causal_lm_cls
    original = AutoModelForCausalLM.from_pretrained(checkpoints[name])
    moved = any(
        not torch.equal(a, b)
        for a, b in zip(reloaded.parameters(), original.parameters(), strict=True)
    )
    assert moved, "two GRPO steps left every weight where it was"


@pytest.mark.parametrize("name", NAMES)
def test_family_sft_two_steps(tmp_path, data, checkpoints, name) -> None:
    run = tmp_path / "run"
    run_areno(
        *base_args(checkpoints[name], data, run), "--algo", "sft", "--dataset-loader-fn",
        str(SFT_LOADER), "--batch-size", "4", "--mini-bs", "4", "--max-new-tokens", "32",
    )  # fmt: skip
    steps = assert_trained_two_finite_steps(run)
    assert steps[1]["train/loss"] < steps[0]["train/loss"] + 1.0


@pytest.mark.parametrize("name", NAMES)
def test_family_dpo_two_steps_starts_at_log_two(tmp_path, data, checkpoints, name) -> None:
    run = tmp_path / "run"
    run_areno(
        *base_args(checkpoints[name], data, run), "--algo", "dpo", "--dataset-loader-fn",
        str(data / "dpo_loader.py"), "--batch-size", "4", "--mini-bs", "4",
    )  # fmt: skip
    steps = assert_trained_two_finite_steps(run)
    # The policy starts as its own reference, so every pair's margin is 0: loss log 2.
    assert abs(steps[0]["train/loss"] - 0.6931472) < 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_family_lora_grpo_two_steps_saves_only_the_adapter(
    tmp_path, data, checkpoints, name
) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")
    run = tmp_path / "run"
    run_areno(*grpo_args(checkpoints[name], data, run), "--lora-rank", "4")
    first = assert_trained_two_finite_steps(run)[0]
    assert abs(first["train/ratio_max"] - 1.0) <= 2e-5
    config = json.loads((run / "step_2" / "adapter_config.json").read_text())
    expected = resolve_target_modules(family(name).build(), None)
    assert sorted(config["target_modules"]) == sorted(expected)
    assert not (run / "step_2" / "model.safetensors").exists()

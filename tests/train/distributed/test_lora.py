"""LoRA on the distributed backend: ``areno train --world-size 2 --lora-rank 4`` (FSDP2 over
the base and the adapters) against the same run in one process, and its resume. CPU, gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areno_core.gates import evaluate_gate
from areno_core.recipe import Gate
from areno_core.testing import run_areno

peft = pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("installed_plugins_only")]

# The tiny model and data of tests/test_e2e_lora.py.
ADAPTER_TENSORS = 28  # 2 layers x 7 projections x (lora_A, lora_B)
# Two processes sum their halves of each gradient in another order than one process does;
# losses and gradient norms agree to float32 rounding. Adam divides each update by the
# root of the squared gradient, so after 2-3 steps at lr 1e-2 the adapter weights of the two
# runs differ by up to ~1e-5 (6e-6 measured); 1e-4 is far below one step (lr 1e-2).
LOSS_ATOL = 1e-6
GRAD_NORM_RTOL = 1e-5
WEIGHT_ATOL = 1e-4


def grpo_args(data: Path, run: Path, *extra: str) -> list[str]:
    return [
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(data / "rows.jsonl"),
        "--dataset-loader-fn", str(data / "rl_loader.py"), "--reward-fn-path",
        str(data / "reward.py"), "--no-activation-checkpointing",
        "--lora-rank", "4", "--lr", "1e-2", "--mini-bs", "4", "--seed", "3",
        "--batch-size", "2", "--n-samples", "4", "--max-new-tokens", "8",
        "--gradient-accumulation-steps", "1", "--save-merged", "--save-path", str(run), *extra,
    ]  # fmt: skip


def two_processes(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "areno_core.cli", *args, "--world-size", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, write_rl_files) -> dict[str, Path]:
    """``two``: 2 steps on 2 processes; ``one``: 3 steps in one process (checkpoints at steps
    2 and 3), prompts not shared between samples, as on the distributed backend."""
    root = tmp_path_factory.mktemp("lora-dist")
    with (REPO / "data" / "gsm8k" / "train.jsonl").open() as f:
        (root / "rows.jsonl").write_text("".join(next(f) for _ in range(32)))
    write_rl_files(root, 40)
    two, one = root / "two", root / "one"
    two_processes(grpo_args(root, two, "--max-steps", "2"))
    run_areno(
        *grpo_args(root, one, "--max-steps", "3", "--save-interval", "2", "--no-share-prefix")
    )
    return {"data": root, "two": two, "one": one}


def history(run: Path) -> list[dict]:
    lines = (run / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    return [h for h in map(json.loads, lines) if "train/loss" in h]


def adapter(checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "adapter_model.safetensors"))


def assert_same_steps(got: list[dict], want: list[dict]) -> None:
    assert [h["step"] for h in got] == [h["step"] for h in want]
    for a, b in zip(got, want, strict=True):
        assert a["rollout/reward_mean"] == b["rollout/reward_mean"]  # the same samples
        assert a["train/loss"] == pytest.approx(b["train/loss"], abs=LOSS_ATOL)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=GRAD_NORM_RTOL)


def assert_same_adapter(got: Path, want: Path) -> None:
    a, b = adapter(got), adapter(want)
    assert set(a) == set(b) and len(a) == ADAPTER_TENSORS
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=WEIGHT_ATOL, rtol=0)


def test_lora_two_processes_grpo_train_like_one_process_and_save_only_the_adapter(runs):
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from areno_core.models.loading import load_model

    two, one = runs["two"], runs["one"]
    assert_same_steps(history(two)[:2], history(one)[:2])
    checkpoint = two / "step_2"
    assert_same_adapter(checkpoint, one / "step_2")
    # The adapter in PEFT's format, no full copy of the weights (merged/ was asked for).
    assert not (checkpoint / "model.safetensors").exists()
    manifest = json.loads((checkpoint / "areno_checkpoint.json").read_text())
    assert manifest["lora"] is True and manifest["exports"] == ["merged"]
    config = json.loads((checkpoint / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    # The shards hold the adapters and their optimizer state only, not the frozen base.
    saved = dcp.FileSystemReader(str(checkpoint / "sharded")).read_metadata()
    weights = [k for k in saved.state_dict_metadata if k.startswith("policy.")]
    assert len(weights) == ADAPTER_TENSORS and all(".lora_" in k for k in weights)
    # Only adapter weights changed: PEFT's base + adapter, merged, is the merged export,
    # whose every other weight is the base's.
    adapted = peft.PeftModel.from_pretrained(load_model("random:qwen3-tiny"), checkpoint)
    want = adapted.merge_and_unload().state_dict()
    got = AutoModelForCausalLM.from_pretrained(checkpoint / "merged").state_dict()
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=0)
    base = load_model("random:qwen3-tiny").state_dict()
    changed = {k for k in base if not torch.equal(got[k], base[k])}
    assert changed and all(k.endswith("_proj.weight") for k in changed)
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=two)
    assert result.passed, result.reason


def test_lora_two_processes_resume_continues_like_one_process(runs):
    two, one = runs["two"], runs["one"]
    two_processes(grpo_args(runs["data"], two, "--max-steps", "3", "--resume", "auto"))
    assert_same_steps(history(two), history(one))
    assert_same_adapter(two / "step_3", one / "step_3")


def test_lora_tensor_parallel_two_processes_train_like_one_process(runs):
    """tp=2: the base projections and the matching adapter halves are split (see
    ``parallelize._linear_plan``); frozen per-head norms stay frozen."""
    run = runs["data"] / "tp2"
    two_processes(grpo_args(runs["data"], run, "--max-steps", "2", "--tp-size", "2"))
    assert_same_steps(history(run), history(runs["one"])[:2])
    assert_same_adapter(run / "step_2", runs["one"] / "step_2")
    assert "tp_size: 2" in (run / "config.yaml").read_text()

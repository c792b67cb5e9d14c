"""`areno train --lora-rank` end to end: every algorithm, checkpoints, exports and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areno_core.gates import evaluate_gate
from areno_core.recipe import Gate
from areno_core.testing import areno_exit_code, run_areno

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

REPO = Path(__file__).resolve().parent.parent
SFT_LOADER = REPO / "examples" / "sft" / "gsm8k_sft_loader.py"
# 2 layers x 7 projections x (lora_A, lora_B)
ADAPTER_TENSORS = 28


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_rl_files, write_dpo_loader) -> Path:
    folder = tmp_path_factory.mktemp("lora-data")
    src = REPO / "data" / "gsm8k" / "train.jsonl"
    with src.open() as f:
        (folder / "rows.jsonl").write_text("".join(next(f) for _ in range(32)))
    write_rl_files(folder, 40)
    write_dpo_loader(folder, 48)
    return folder


def command(data: Path, algo: str) -> list[str]:
    argv = [
        "train", "--algo", algo, "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(data / "rows.jsonl"), "--no-activation-checkpointing",
        "--lora-rank", "4", "--lr", "1e-2", "--mini-bs", "4", "--seed", "3",
    ]  # fmt: skip
    if algo == "sft":
        return [*argv, "--dataset-loader-fn", str(SFT_LOADER), "--max-new-tokens", "32",
                "--batch-size", "4"]  # fmt: skip
    if algo == "dpo":
        return [*argv, "--dataset-loader-fn", str(data / "dpo_loader.py"),
                "--max-new-tokens", "16", "--batch-size", "4"]  # fmt: skip
    argv += [
        "--dataset-loader-fn", str(data / "rl_loader.py"), "--reward-fn-path",
        str(data / "reward.py"), "--batch-size", "2", "--n-samples", "4",
        "--max-new-tokens", "8", "--gradient-accumulation-steps", "1",
    ]  # fmt: skip
    if algo == "ppo":
        argv += ["--critic-warmup-steps", "1", "--kl-loss-coef", "0.5"]
    return argv


def with_rank(argv: list[str], rank: int | None) -> list[str]:
    """``argv`` with ``--lora-rank`` set to ``rank`` (left out for None)."""
    at = argv.index("--lora-rank")
    rest = argv[:at] + argv[at + 2 :]
    return rest if rank is None else [*rest, "--lora-rank", str(rank)]


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]


@pytest.mark.parametrize("algo", ["sft", "dpo", "grpo", "gspo", "rloo", "ppo"])
def test_lora_every_algorithm_trains_adapters_only_and_saves_them_in_peft_format(
    tmp_path, data, algo
):
    run = tmp_path / algo
    run_areno(*command(data, algo), "--max-steps", "2", "--save-path", str(run))
    steps = [h for h in history(run) if "train/loss" in h]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(h["train/loss"])) for h in steps)
    checkpoint = run / "step_2"
    assert (checkpoint / "adapter_config.json").is_file()
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model.safetensors").exists()  # no full copy of the weights
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    optimized = [p for g in state["optimizer"]["param_groups"] for p in g["params"]]
    assert len(optimized) == ADAPTER_TENSORS
    manifest = json.loads((checkpoint / "areno_checkpoint.json").read_text())
    assert manifest["lora"] is True
    if algo == "ppo":
        assert (checkpoint / "critic" / "model.safetensors").is_file()  # the critic is full
        assert any(h["train/kl"] != 0.0 for h in steps)
    result = evaluate_gate(Gate("checkpoint_loadable"), [], checkpoint_root=run)
    assert result.passed, result.reason


@pytest.mark.parametrize("algo", ["dpo", "grpo"])
def test_lora_resume_continues_with_identical_losses(tmp_path, data, algo):
    argv = command(data, algo)
    full, part = tmp_path / "full", tmp_path / "part"
    run_areno(*argv, "--max-steps", "4", "--save-path", str(full))
    run_areno(*argv, "--max-steps", "2", "--save-path", str(part))
    run_areno(*argv, "--max-steps", "4", "--save-path", str(part), "--resume", "auto")
    a = [h["train/loss"] for h in history(full) if "train/loss" in h]
    b = [h["train/loss"] for h in history(part) if "train/loss" in h]
    assert len(a) == len(b) == 4
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=1e-6, rtol=1e-6)
    if algo == "dpo":  # the reference (the base) must score the same after resume
        ka = [h["train/rewards/margin"] for h in history(full) if "train/loss" in h]
        kb = [h["train/rewards/margin"] for h in history(part) if "train/loss" in h]
        torch.testing.assert_close(torch.tensor(kb), torch.tensor(ka), atol=1e-6, rtol=1e-6)


def test_lora_save_merged_writes_a_plain_model_equal_to_the_adapted_policy(tmp_path, data):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areno_core.models.loading import load_model

    run = tmp_path / "merged"
    run_areno(*command(data, "sft"), "--max-steps", "2", "--save-merged", "--save-path", str(run))
    checkpoint = run / "step_2"
    manifest = json.loads((checkpoint / "areno_checkpoint.json").read_text())
    assert manifest["exports"] == ["merged"]
    assert "merged/model.safetensors" in manifest["files"]
    merged = AutoModelForCausalLM.from_pretrained(checkpoint / "merged")
    adapted = PeftModel.from_pretrained(load_model("random:qwen3-tiny"), checkpoint)
    ids = AutoTokenizer.from_pretrained(checkpoint / "merged")("Q: 7+5?", return_tensors="pt")
    with torch.no_grad():
        want = adapted(input_ids=ids.input_ids).logits
        got = merged(input_ids=ids.input_ids).logits
    # Merging rounds in float32: a bound relative to the logits' scale (docs/lora.md).
    torch.testing.assert_close(got, want, atol=2e-6 * float(want.abs().max()), rtol=0)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = areno_exit_code(*argv)
    return code, " ".join(capsys.readouterr().err.split())


def test_lora_resume_keeps_the_saved_lora_options_and_refuses_other_ones(tmp_path, data, capsys):
    run = tmp_path / "run"
    run_areno(*command(data, "sft"), "--max-steps", "1", "--save-path", str(run))
    capsys.readouterr()
    other = with_rank(command(data, "sft"), 8)
    code, err = run_cli(capsys, *other, "--save-path", str(run), "--resume", "auto")
    assert code == 2 and "changes --lora-rank 4 -> 8" in err
    assert sorted(p.name for p in run.iterdir()) == [
        "config.yaml",
        "latest",
        "step_1",
        "tensorboard",
    ]
    # Without LoRA flags the run continues with its saved adapters (rank 4).
    without = with_rank(command(data, "sft"), None)
    code, err = run_cli(
        capsys, *without, "--max-steps", "2", "--save-path", str(run), "--resume", "auto"
    )
    assert code == 0, err
    adapter = json.loads((run / "step_2" / "adapter_config.json").read_text())
    assert adapter["r"] == 4
    assert not (run / "step_2" / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lora-alpha", "8"], "--lora-alpha only applies with --lora-rank"),
        (["--save-merged"], "--save-merged only applies with --lora-rank"),
        (["--lora-rank", "4", "--lora-target-modules", "q_proj,attn"], "'attn' is not a linear"),
        (["--lora-rank", "0"], "--lora-rank must be positive, got 0"),
        (["--lora-rank", "4", "--lora-dropout", "1.5"], "--lora-dropout must be in [0, 1)"),
    ],
)
def test_lora_bad_options_fail_clearly_before_any_output(tmp_path, data, capsys, extra, message):
    argv = with_rank(command(data, "sft"), None)
    code, err = run_cli(capsys, *argv, *extra, "--save-path", str(tmp_path / "run"))
    assert code == 2, err
    assert message in err
    assert not (tmp_path / "run").exists()


def test_lora_without_peft_is_not_available_before_loading(tmp_path, data, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    code, err = run_cli(capsys, *command(data, "sft"), "--save-path", str(tmp_path / "run"))
    assert code != 0
    assert "--lora-rank needs the peft package: pip install 'areno-core[lora]'" in err
    assert not (tmp_path / "run").exists()


def test_lora_dropout_with_tensor_parallel_is_refused_before_any_process_starts(
    tmp_path, data, capsys
):
    """Adapter dropout is not coordinated across tensor-parallel ranks, so the distributed
    backend refuses it with --tp-size > 1 up front (LoRA with --world-size 2, --tp-size 1 or
    2, runs: tests/train/distributed/test_lora.py)."""
    code, err = run_cli(
        capsys, *command(data, "grpo"), "--max-steps", "2", "--save-path", str(tmp_path / "run"),
        "--backend", "distributed", "--world-size", "2", "--tp-size", "2",
        "--lora-dropout", "0.1",
    )  # fmt: skip
    assert code == 2
    assert "--lora-dropout 0.1 with --tp-size 2: dropout on the adapters' input is not" in err
    assert "use --lora-dropout 0 or --tp-size 1" in err
    assert not (tmp_path / "run").exists()

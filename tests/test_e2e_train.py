"""End-to-end runs of `areno train` on a tiny random Qwen3 and real GSM8K rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areno_core.cli.main import main
from areno_core.metrics.logger import read_scalars
from areno_core.testing import run_areno

REPO = Path(__file__).resolve().parent.parent
SFT_LOADER = REPO / "examples" / "sft" / "gsm8k_sft_loader.py"

DPO_LOADER = """
def load_row(row):
    final = row["answer"].split("####")[-1].strip()
    return {
        "prompt": row["question"][:64],
        "chosen": "The answer is " + final + ".",
        "rejected": "I do not know, sorry!",
    }
"""


pytestmark = pytest.mark.usefixtures("installed_plugins_only")


areno = run_areno


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]


@pytest.fixture(scope="module")
def gsm8k_rows(tmp_path_factory) -> Path:
    src = REPO / "data" / "gsm8k" / "train.jsonl"
    path = tmp_path_factory.mktemp("data") / "gsm8k_head.jsonl"
    with src.open() as f:
        path.write_text("".join(next(f) for _ in range(96)))
    return path


def test_sft_on_gsm8k_loss_falls_and_checkpoint_loads(tmp_path, gsm8k_rows):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "sft"
    areno(
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(SFT_LOADER),
        "--batch-size", "8", "--mini-bs", "4", "--lr", "3e-3", "--max-new-tokens", "128",
        "--no-activation-checkpointing", "--max-steps", "12", "--save-interval", "6",
        "--save-path", str(run),
    )  # fmt: skip
    losses = [h["train/loss"] for h in history(run)]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    assert (run / "latest").read_text().strip() == "step_12"
    assert (run / "config.yaml").is_file() and (run / "step_6").is_dir()
    model = AutoModelForCausalLM.from_pretrained(run / "step_12")
    tokenizer = AutoTokenizer.from_pretrained(run / "step_12")
    ids = tokenizer("Natalia sold", return_tensors="pt").input_ids
    assert model(ids).logits.shape[-1] >= len(tokenizer)
    scalars = read_scalars(run / "tensorboard")
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 13))
    torch.testing.assert_close(scalars["train/loss"][-1][1], losses[-1], atol=1e-5, rtol=1e-5)


def test_dpo_margin_and_accuracy_rise(tmp_path, gsm8k_rows):
    loader = tmp_path / "dpo_loader.py"
    loader.write_text(DPO_LOADER)
    run = tmp_path / "dpo"
    areno(
        "train", "--algo", "dpo", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(loader),
        "--batch-size", "8", "--mini-bs", "8", "--lr", "2e-3", "--dpo-beta", "0.1",
        "--no-activation-checkpointing", "--max-steps", "10", "--save-path", str(run),
    )  # fmt: skip
    steps = history(run)
    first, last = steps[0], steps[-1]
    assert last["train/rewards/margin"] > first["train/rewards/margin"] + 0.5
    assert last["train/rewards/accuracy"] >= 0.75
    assert abs(first["train/rewards/margin"]) < 0.05  # policy == reference at step 1


# CI trains these four shapes once, in the smoke matrix (internal/areno-smoke: smoke/grpo,
# smoke/gspo, smoke/rloo, smoke/ppo), whose gates check what this test checks.
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "gspo", "rloo", "ppo"])
def test_online_algorithms_run_and_write_metrics_and_checkpoint(
    tmp_path, gsm8k_rows, algo, write_rl_files
):
    loader, reward = write_rl_files(tmp_path, 48)
    run = tmp_path / algo
    areno(
        "train", "--algo", algo, "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(loader),
        "--reward-fn-path", str(reward), "--batch-size", "4", "--n-samples", "4",
        "--mini-bs", "4", "--gradient-accumulation-steps", "1", "--max-new-tokens", "12",
        "--lr", "1e-3", "--critic-warmup-steps", "1", "--no-activation-checkpointing",
        "--max-steps", "2", "--save-path", str(run),
    )  # fmt: skip
    steps = history(run)
    assert len(steps) == 2
    last = steps[-1]
    for key in (
        "rollout/reward_mean", "rollout/accuracy", "rollout/truncation_rate",
        "rollout/response_length_mean", "train/policy_loss", "train/clip_fraction",
        "train/ratio_mean", "train/grad_norm", "train/lr", "time/rollout", "time/train",
    ):  # fmt: skip
        assert key in last, key
    assert last["train/optimizer_steps"] == 4.0
    # Several optimizer steps per rollout batch: later minibatches see a moved policy.
    assert last["train/ratio_max"] > 1.0 + 1e-4 or last["train/ratio_min"] < 1.0 - 1e-4
    assert (run / "step_2" / "model.safetensors").is_file()
    if algo == "ppo":
        assert "train/value_loss" in last and "rollout/explained_variance" in last
        assert (run / "step_2" / "critic").is_dir()


@pytest.mark.parametrize("algo", ["sft", "grpo", "ppo"])
def test_resume_continues_with_identical_losses(tmp_path, gsm8k_rows, algo, write_rl_files):
    common = [
        "train", "--algo", algo, "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--batch-size", "16", "--mini-bs", "8",
        "--lr", "2e-3", "--no-activation-checkpointing", "--epochs", "2", "--seed", "7",
    ]  # fmt: skip
    if algo == "sft":
        common += ["--dataset-loader-fn", str(SFT_LOADER), "--max-new-tokens", "64"]
        total, cut = 8, 6  # 96 rows / 16 = 6 steps per epoch: resume at an epoch boundary
    else:
        loader, reward = write_rl_files(tmp_path, 48)
        common += [
            "--dataset-loader-fn", str(loader), "--reward-fn-path", str(reward),
            "--batch-size", "2", "--n-samples", "4", "--max-new-tokens", "10",
            "--gradient-accumulation-steps", "1",
            # Greedy evaluation draws no random numbers: the resumed run must stay identical.
            "--eval-dataset-path", str(gsm8k_rows), "--eval-limit", "6", "--eval-interval", "1",
        ]  # fmt: skip
        total, cut = 4, 2
    if algo == "ppo":
        # The critic (saved as a classifier) and the KL reference (the initial policy, not the
        # resumed one) must both come back; the actor trains from step 2 on.
        common += ["--critic-warmup-steps", "1", "--kl-loss-coef", "0.5"]
    full, part = tmp_path / "full", tmp_path / "part"
    areno(*common, "--max-steps", str(total), "--save-path", str(full))
    areno(*common, "--max-steps", str(cut), "--save-path", str(part), "--save-interval", "100")
    areno(*common, "--max-steps", str(total), "--save-path", str(part), "--resume", "auto")
    a = [h["train/loss"] for h in history(full) if "train/loss" in h]
    b = [h["train/loss"] for h in history(part) if "train/loss" in h]
    assert len(a) == len(b) == total
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=1e-6, rtol=1e-6)
    if algo == "ppo":
        for key in ("train/kl", "train/value_loss", "rollout/explained_variance"):
            ka = [h[key] for h in history(full) if "train/loss" in h]
            kb = [h[key] for h in history(part) if "train/loss" in h]
            torch.testing.assert_close(torch.tensor(kb), torch.tensor(ka), atol=1e-6, rtol=1e-6)
        assert any(h["train/kl"] != 0.0 for h in history(full) if "train/loss" in h)
    if algo != "sft":
        ra = [h["rollout/reward_mean"] for h in history(full) if "train/loss" in h]
        rb = [h["rollout/reward_mean"] for h in history(part) if "train/loss" in h]
        assert ra == rb
        ea = [(h["step"], h["eval/reward_mean"]) for h in history(full) if "eval/accuracy" in h]
        eb = [(h["step"], h["eval/reward_mean"]) for h in history(part) if "eval/accuracy" in h]
        assert [s for s, _ in ea] == [0, 1, 2, 3, 4]
        assert eb == ea


def test_bad_reward_path_fails_before_any_output_is_written(tmp_path, gsm8k_rows, capsys):
    run = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main([
            "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
            "--dataset-path", str(gsm8k_rows), "--reward-fn-path", str(tmp_path / "nope.py"),
            "--save-path", str(run),
        ])  # fmt: skip
    assert info.value.code == 2
    assert "nope.py" in capsys.readouterr().err
    assert not run.exists()


def test_sft_rows_missing_response_are_named_before_training(tmp_path, gsm8k_rows, capsys):
    with pytest.raises(SystemExit) as info:
        main([
            "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny",
            "--dataset-path", str(gsm8k_rows), "--save-path", str(tmp_path / "x"),
        ])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 2
    assert "row 0" in err and "prompt" in err
    assert not (tmp_path / "x").exists()


def test_dpo_multi_message_continuation_refused_before_training_with_row_and_file(tmp_path, capsys):
    user = {"role": "user", "content": "What is 2+2?"}
    good, bad = {"role": "assistant", "content": "4"}, {"role": "assistant", "content": "5"}
    follow = {"role": "user", "content": "Sure?"}
    pairs = [{"chosen": [user, good], "rejected": [user, bad]}] * 3
    pairs.append({"chosen": [user, good, follow, good], "rejected": [user, bad, follow, bad]})
    data = tmp_path / "hh.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    run = tmp_path / "never"
    with pytest.raises(SystemExit) as info:
        main(["train", "--algo", "dpo", "--ckpt", "random:qwen3-tiny", "--dataset-path",
              str(data), "--save-path", str(run)])  # fmt: skip
    err = "".join(capsys.readouterr().err.split())  # the console wraps long paths anywhere
    assert info.value.code == 2
    assert f"dpo:datasetrow3of{data}:key'chosen'holds3message(s)" in err
    assert "SFTresponse" not in err
    assert not run.exists()


def test_save_path_under_a_file_is_a_clear_error_before_loading(tmp_path, gsm8k_rows, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as info:
        main(["train", "--algo", "sft", "--ckpt", "random:qwen3-tiny", "--dataset-path",
              str(gsm8k_rows), "--dataset-loader-fn", str(SFT_LOADER),
              "--save-path", str(blocker / "run")])  # fmt: skip
    err = "".join(capsys.readouterr().err.split())
    assert info.value.code == 2
    assert f"--save-path'{blocker}/run'cannotbeusedasafolder:'{blocker}'isafile" in err
    assert "Traceback" not in err
    assert blocker.read_text() == "not a folder"


def test_resume_on_dataset_of_other_size_is_a_clear_error(tmp_path, gsm8k_rows, capsys):
    run = tmp_path / "run"
    base = [
        "train",
        "--algo",
        "sft",
        "--ckpt",
        "random:qwen3-tiny",
        "--dataset-loader-fn",
        str(SFT_LOADER),
        "--batch-size",
        "4",
        "--mini-bs",
        "4",
        "--max-new-tokens",
        "16",
        "--no-activation-checkpointing",
        "--save-interval",
        "1",
        "--save-path",
        str(run),
    ]
    data = tmp_path / "data.jsonl"
    lines = gsm8k_rows.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:20]))
    areno(*base, "--dataset-path", str(data), "--max-steps", "1")  # fmt: skip
    data.write_text("".join(lines))  # the same file, other content
    with pytest.raises(SystemExit) as info:
        main([*base, "--dataset-path", str(data), "--max-steps", "2", "--resume", "auto"])
    err = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 2
    assert "that run trained on 20 rows, but --dataset-path" in err
    assert "gives 96 rows (after the loader)" in err and "Traceback" not in err
    data.write_text("".join(lines[20:40]))  # as many rows, other ones
    with pytest.raises(SystemExit) as info:
        main([*base, "--dataset-path", str(data), "--max-steps", "2", "--resume", "auto"])
    err = " ".join(capsys.readouterr().err.split())
    assert "gives 20 rows, as many as that run trained on, but not the same rows" in err
    assert (run / "latest").read_text().strip() == "step_1"


def test_ppo_with_reward_model_scores_samples_with_it(tmp_path, gsm8k_rows, write_rl_files):
    loader, _ = write_rl_files(tmp_path, 48)
    run = tmp_path / "ppo_rm"
    areno(
        "train", "--algo", "ppo", "--ckpt", "random:qwen3-tiny",
        "--reward-ckpt", "random:qwen3-tiny?seed=3", "--dataset-path", str(gsm8k_rows),
        "--dataset-loader-fn", str(loader), "--batch-size", "2", "--n-samples", "2",
        "--mini-bs", "4", "--max-new-tokens", "8", "--critic-warmup-steps", "0",
        "--no-activation-checkpointing", "--max-steps", "1", "--save-path", str(run),
    )  # fmt: skip
    [step] = history(run)
    # A reward model gives continuous scores, not the 0/1 of a verifier.
    assert step["rollout/reward_std"] > 0 and step["rollout/reward_errors"] == 0


def test_drop_uniform_groups_removes_groups_without_signal(tmp_path, gsm8k_rows, write_rl_files):
    loader, reward = write_rl_files(tmp_path, 48)
    reward.write_text("def reward_fn(record):\n    return 1.0\n")
    run = tmp_path / "uniform"
    areno(
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(loader),
        "--reward-fn-path", str(reward), "--batch-size", "3", "--n-samples", "2",
        "--max-new-tokens", "4", "--drop-uniform-groups", "--no-activation-checkpointing",
        "--max-steps", "1", "--save-path", str(run),
    )  # fmt: skip
    [step] = history(run)
    assert step["rollout/uniform_groups"] == 3.0
    assert "train/optimizer_steps" not in step  # nothing left to train on


def test_fresh_run_into_used_save_path_refused_and_reused_log_dir_starts_over(
    tmp_path, gsm8k_rows, capsys
):
    common = [
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(SFT_LOADER),
        "--batch-size", "4", "--mini-bs", "4", "--max-new-tokens", "32",
        "--no-activation-checkpointing",
    ]  # fmt: skip
    run = tmp_path / "run"
    areno(*common, "--max-steps", "2", "--save-path", str(run))
    before = (run / "tensorboard" / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit) as info:
        main([*common, "--max-steps", "3", "--save-path", str(run)])
    err = " ".join(capsys.readouterr().err.split())
    assert info.value.code == 2
    assert str(run) in err and "step_2" in err and "--resume auto" in err
    assert (run / "tensorboard" / "metrics.jsonl").read_text() == before
    assert not (run / "step_3").exists()

    # Without --save-path, the same --metrics-log-dir twice holds only the second run.
    logs = tmp_path / "logs"
    areno(*common, "--max-steps", "3", "--metrics-log-dir", str(logs))
    areno(*common, "--max-steps", "2", "--metrics-log-dir", str(logs))
    steps = [json.loads(line)["step"] for line in (logs / "metrics.jsonl").open()]
    assert steps == [1, 2]


def test_eval_dataset_logs_greedy_eval_at_start_interval_and_end(
    tmp_path, gsm8k_rows, capsys, write_rl_files
):
    loader, reward = write_rl_files(tmp_path, 48)
    run = tmp_path / "run"
    areno(
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(loader),
        "--reward-fn-path", str(reward), "--batch-size", "2", "--n-samples", "2",
        "--max-new-tokens", "6", "--no-activation-checkpointing", "--max-steps", "5",
        "--eval-dataset-path", str(gsm8k_rows), "--eval-limit", "5", "--eval-interval", "2",
        "--save-path", str(run),
    )  # fmt: skip
    rows = {h["step"]: h for h in history(run)}
    evaluated = sorted(s for s, h in rows.items() if "eval/accuracy" in h)
    assert evaluated == [0, 2, 4, 5]  # start, every 2 steps, and the last step
    start = rows[0]
    assert set(start) == {
        "step", "eval/accuracy", "eval/reward_mean", "eval/response_length_mean",
        "eval/truncation_rate", "eval/skipped_rows", "time/eval",
    }  # fmt: skip
    assert start["eval/skipped_rows"] == 0.0
    for step in evaluated:
        h = rows[step]
        assert 0.0 <= h["eval/accuracy"] <= 1.0 and 0.0 <= h["eval/reward_mean"] <= 1.0
        assert 0 < h["eval/response_length_mean"] <= 6
    summary = " ".join(capsys.readouterr().out.split())
    assert "eval accuracy" in summary


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--eval-interval", "5"], "--eval-interval needs --eval-dataset-path"),
        (["--algo", "sft", "--eval-dataset-path", "BAD"], "row 0"),
        (["--eval-dataset-path", "missing.jsonl"], "missing.jsonl"),
    ],
)
def test_eval_options_bad_values_fail_before_output(
    tmp_path, gsm8k_rows, capsys, extra, message, write_rl_files
):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no response here"}\n')
    extra = [str(bad) if a == "BAD" else a for a in extra]
    loader, reward = write_rl_files(tmp_path, 48)
    algo = [] if "--algo" in extra else ["--algo", "grpo", "--reward-fn-path", str(reward)]
    loader_args = [] if "--algo" in extra else ["--dataset-loader-fn", str(loader)]
    if "--algo" in extra:
        loader_args = ["--dataset-loader-fn", str(SFT_LOADER)]
    with pytest.raises(SystemExit) as info:
        main([
            "train", *algo, "--ckpt", "random:qwen3-tiny", "--dataset-path", str(gsm8k_rows),
            *loader_args, *extra, "--save-path", str(tmp_path / "never"),
        ])  # fmt: skip
    assert info.value.code == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "never").exists()


def test_sft_eval_dataset_logs_held_out_loss_that_falls(tmp_path, gsm8k_rows, capsys):
    run = tmp_path / "sft"
    areno(
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(SFT_LOADER),
        "--eval-dataset-path", str(gsm8k_rows), "--eval-limit", "8", "--eval-interval", "4",
        "--batch-size", "8", "--mini-bs", "4", "--lr", "3e-3", "--max-new-tokens", "64",
        "--no-activation-checkpointing", "--max-steps", "8", "--save-path", str(run),
    )  # fmt: skip
    rows = {h["step"]: h for h in history(run)}
    evaluated = sorted(s for s, h in rows.items() if "eval/loss" in h)
    assert evaluated == [0, 4, 8]
    assert set(rows[0]) == {"step", "eval/loss", "eval/nll", "eval/skipped_rows", "time/eval"}
    assert rows[0]["eval/skipped_rows"] == 0.0
    assert rows[8]["eval/loss"] < 0.9 * rows[0]["eval/loss"]  # it learns the rows it sees
    assert rows[8]["eval/loss"] == pytest.approx(rows[8]["eval/nll"])
    summary = " ".join(capsys.readouterr().out.split())
    assert f"eval loss │ {rows[0]['eval/loss']:.4g} -> {rows[8]['eval/loss']:.4g}" in summary


def test_ppo_in_bfloat16_trains_through_float32_master_weights(
    tmp_path, gsm8k_rows, write_rl_files
):
    from safetensors import safe_open

    loader, reward = write_rl_files(tmp_path, 48)
    run = tmp_path / "run"
    areno(
        "train", "--algo", "ppo", "--ckpt", "random:qwen3-tiny", "--dtype", "bfloat16",
        "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(loader),
        "--reward-fn-path", str(reward), "--batch-size", "2", "--n-samples", "2",
        "--max-new-tokens", "6", "--critic-warmup-steps", "0", "--lr", "1e-3",
        "--max-steps", "1", "--save-path", str(run),
    )  # fmt: skip
    step = history(run)[0]
    assert step["train/grad_norm"] > 0 and step["memory/train_peak_mib"] > 0
    with safe_open(run / "step_1" / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    state = torch.load(run / "step_1" / "trainer_state.pt", weights_only=True)
    masters = state["optimizer"]["master_weights"]
    assert masters and {m.dtype for m in masters} == {torch.float32}
    assert {m.dtype for m in state["extra"]["critic"]["optimizer"]["master_weights"]} == {
        torch.float32
    }


def test_sft_packed_forward_trains_the_same_losses_as_padded_rows(tmp_path, gsm8k_rows):
    losses = {}
    for flag in ("--packed-forward", "--no-packed-forward"):
        run = tmp_path / flag.strip("-")
        areno(
            "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny",
            "--dataset-path", str(gsm8k_rows), "--dataset-loader-fn", str(SFT_LOADER),
            "--batch-size", "8", "--mini-bs", "4", "--lr", "3e-3", "--max-new-tokens", "64",
            "--no-activation-checkpointing", "--max-steps", "3", flag, "--save-path", str(run),
        )  # fmt: skip
        config = (run / "config.yaml").read_text()
        assert f"packed_forward: {str(flag == '--packed-forward').lower()}" in config
        losses[flag] = [h["train/loss"] for h in history(run)]
    # Same rows, same updates: the packed forward differs from the padded one by rounding only.
    torch.testing.assert_close(
        losses["--packed-forward"], losses["--no-packed-forward"], atol=1e-4, rtol=1e-4
    )

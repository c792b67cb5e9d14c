"""What a resumed run may change, interrupting a run with Ctrl-C, and the errors that stop a run
that would train nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from areno_core.cli.main import main
from areno_core.testing import run_areno

REPO = Path(__file__).resolve().parent.parent
SFT_LOADER = REPO / "examples" / "sft" / "gsm8k_sft_loader.py"
GSM8K = REPO / "data" / "gsm8k" / "train.jsonl"

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


def _sft(run: Path) -> list[str]:
    return [
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(GSM8K),
        "--dataset-loader-fn", str(SFT_LOADER), "--batch-size", "4", "--mini-bs", "4",
        "--max-new-tokens", "16", "--lr", "3e-3", "--no-activation-checkpointing",
        "--save-path", str(run),
    ]  # fmt: skip


def _exit(capsys, argv: list[str]) -> tuple[int, str]:
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, " ".join(capsys.readouterr().err.split())


def _losses(run: Path) -> list[float]:
    lines = (run / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["train/loss"] for line in lines]


def test_resume_takes_the_saved_options_and_applies_only_allowed_changes(tmp_path, capsys):
    full, part = tmp_path / "full", tmp_path / "part"
    run_areno(*_sft(full), "--max-steps", "4")
    run_areno(*_sft(part), "--max-steps", "2")
    # Only the save path, --resume and a longer run: everything else comes from the checkpoint.
    run_areno("train", "--save-path", str(part), "--resume", "auto", "--max-steps", "4")
    assert _losses(part) == _losses(full)
    saved = yaml.safe_load((part / "config.yaml").read_text())
    assert saved["train"]["lr"] == 3e-3 and saved["basic"]["max_steps"] == 4
    assert saved["checkpoint"]["resume"] == "auto"

    code, err = _exit(capsys, [*_sft(part), "--max-steps", "5", "--resume", "auto",
                               "--lr", "1e-2", "--batch-size", "8"])  # fmt: skip
    assert code == 2
    assert "changes --batch-size 4 -> 8, --lr 0.003 -> 0.01" in err
    assert "Drop those flags to continue the run as it was" in err
    assert (part / "latest").read_text().strip() == "step_4"
    code, err = _exit(capsys, [*_sft(part), "--resume", "auto", "--algo", "dpo"])
    assert code == 2 and "changes --algo 'sft' -> 'dpo'" in err


def test_resume_with_the_same_flags_again_is_accepted(tmp_path):
    run = tmp_path / "run"
    run_areno(*_sft(run), "--max-steps", "1")
    run_areno(*_sft(run), "--max-steps", "2", "--resume", "auto")
    assert (run / "latest").read_text().strip() == "step_2"


def test_ctrl_c_finishes_the_step_saves_and_prints_the_resume_command(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "areno_core.cli.main", *_sft(run), "--max-steps", "400",
            "--save-interval", "1000"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)  # fmt: skip
    metrics = run / "tensorboard" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    steps = len(metrics.read_text().splitlines())
    assert 2 <= steps < 400
    assert (run / "latest").read_text().strip() == f"step_{steps}"
    text = " ".join(out.split())
    assert "Interrupted: finishing the current step, then I save a checkpoint and stop" in text
    assert f"Stopped after step {steps} of 400" in text
    assert f"areno train --resume auto --save-path {run}" in text
    run_areno("train", "--resume", "auto", "--save-path", str(run), "--max-steps", str(steps + 1))
    assert (run / "latest").read_text().strip() == f"step_{steps + 1}"


def test_group_algorithm_with_one_sample_per_prompt_is_refused(tmp_path, capsys):
    code, err = _exit(capsys, ["train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
                               "--dataset-path", str(GSM8K), "--reward-fn-path", "x.py",
                               "--n-samples", "1", "--save-path", str(tmp_path / "r")])  # fmt: skip
    assert code == 2
    assert "--algo grpo compares each sample with the other samples of its prompt" in err
    assert "--n-samples 1 gives every sample an advantage of 0" in err
    assert not (tmp_path / "r").exists()


def test_every_prompt_too_long_is_refused_before_the_model_loads(tmp_path, capsys):
    loader = tmp_path / "loader.py"
    loader.write_text("def load_row(row):\n    return {'prompt': row['question'], 'answer': '1'}\n")
    reward = tmp_path / "reward.py"
    reward.write_text("def reward_fn(record):\n    return 0.0\n")
    code, err = _exit(capsys, ["train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
                               "--dataset-path", str(GSM8K), "--dataset-loader-fn", str(loader),
                               "--reward-fn-path", str(reward), "--max-prompt-tokens", "8",
                               "--save-path", str(tmp_path / "r")])  # fmt: skip
    assert code == 2
    assert "every prompt of --dataset-path" in err and "(256 rows) is longer than" in err
    assert "--max-prompt-tokens 8 (the shortest has" in err
    assert not (tmp_path / "r").exists()

"""``python -m areno_core.gpu_check`` on a CPU: the clear exit without CUDA, the plan of steps
and their skips, the table and JSON it writes, and one of its runs for real on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areno_core import gpu_check
from areno_core.gpu_check import StepResult

REPO = Path(__file__).resolve().parents[1]


def run_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "areno_core.gpu_check", *args],
        capture_output=True, text=True, timeout=300, cwd=str(REPO),
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit on machines without CUDA")
def test_without_cuda_it_exits_at_once_naming_what_is_missing(tmp_path):
    proc = run_check("--out", str(tmp_path / "out"))
    assert proc.returncode == gpu_check.NO_CUDA_EXIT
    assert "gpu_check needs a CUDA GPU: torch" in proc.stderr
    assert "CPU-only build" in proc.stderr or "finds no CUDA GPU" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written
    shell = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert shell.returncode == gpu_check.NO_CUDA_EXIT, shell.stderr


def test_dry_run_lists_every_step_and_why_one_is_skipped(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "importable", lambda module: module != "sglang")
    assert gpu_check.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [s.name for s in gpu_check.STEPS]
    assert lines[6].endswith("[skipped: sglang is not importable]")
    assert gpu_check.attention_backend() == "flash"  # flash_attn "importable" here


def test_gpu_tests_collect_only_the_files_that_hold_gpu_tests():
    files = gpu_check.gpu_test_files()
    assert "tests/rollout/test_cuda_graphs.py" in files
    assert "plugins/areno-sglang/tests/test_gpu.py" in files
    # A file without a gpu test (and whatever optional package it imports) is not collected.
    assert "tests/test_gpu_check.py" not in files
    assert "plugins/areno-envs/tests/test_vf_train.py" not in files


def test_unknown_step_and_bad_numbers_are_refused_with_the_choices():
    with pytest.raises(SystemExit, match="--only grpo_fast: unknown step; the steps are gpu_tests"):
        gpu_check.plan_steps(["grpo_fast"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--steps", "0"])


def test_table_and_json_from_step_results(tmp_path):
    results = [
        StepResult("gpu_tests", "ok", 41.2, metrics={"passed": 9, "failed": 0, "skipped": 1}),
        StepResult(
            "grpo_graphs", "ok", 75.0,
            metrics={"step_s": 4.25, "decode_tokens_per_s": 5123.4, "train_peak_mib": 9000.0,
                     "ratio_min": 0.99871, "ratio_max": 1.0021},
        ),
        StepResult("grpo_sglang", "skipped", reason="sglang is not importable"),
    ]  # fmt: skip
    gpu_check.write_results(tmp_path, results, {"machine": {"gpu": "test"}})
    table = (tmp_path / "gpu_check.md").read_text().splitlines()
    assert table[0].startswith("| step | status | seconds | step s | decode tok/s |")
    assert (
        table[2] == "| gpu_tests | ok | 41 |  |  |  |  |  |  |  | 9 passed, 0 failed, 1 skipped |"
    )
    assert table[3] == (
        "| grpo_graphs | ok | 75 | 4.25 | 5,123 |  |  | 9,000 | 0.9987 | 1.0021 |  |"
    )
    assert table[4].endswith("| sglang is not importable |")
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    assert payload["machine"] == {"gpu": "test"}
    assert payload["steps"][1]["metrics"]["decode_tokens_per_s"] == 5123.4


def test_junit_counts_and_run_summary(tmp_path):
    xml = tmp_path / "report.xml"
    xml.write_text(
        '<testsuites><testsuite tests="7" failures="1" errors="1" skipped="2"/></testsuites>'
    )
    assert gpu_check.junit_counts(xml) == {"passed": 3.0, "failed": 2.0, "skipped": 2.0}
    run = tmp_path / "run" / "tensorboard"
    run.mkdir(parents=True)
    rollout = {"rollout/samples": 32}
    steps = [
        {**rollout, "time/step": 9.0, "time/rollout": 5.0, "rollout/response_length_mean": 100,
         "memory/train_peak_mib": 700.0, "train/ratio_min": 0.999, "train/ratio_max": 1.001},
        {**rollout, "time/step": 3.0, "time/rollout": 2.0, "rollout/response_length_mean": 50,
         "memory/train_peak_mib": 800.0, "train/tokens_per_s": 1000.0},
        {**rollout, "time/step": 5.0, "time/rollout": 2.0, "rollout/response_length_mean": 75,
         "memory/train_peak_mib": 750.0, "train/tokens_per_s": 3000.0},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    summary = gpu_check.summarize_run(tmp_path / "run")
    # the first step (graph capture, warm-up) is left out of the timings
    assert summary["step_s"] == 4.0
    assert summary["decode_tokens_per_s"] == (32 * 50 + 32 * 75) / 4.0
    assert summary["train_tokens_per_s"] == 2000.0
    assert summary["train_peak_mib"] == 800.0
    assert (summary["ratio_min"], summary["ratio_max"]) == (0.999, 1.001)


@pytest.mark.slow  # about 25 s on an idle 2-core CPU, a minute under load
@pytest.mark.usefixtures("installed_plugins_only")
def test_one_grpo_step_runs_for_real_on_a_tiny_model(tmp_path):
    """The code path of a GPU run, on this CPU (``--allow-cpu`` exists for this test)."""
    out = tmp_path / "out"
    proc = run_check(
        "--allow-cpu", "--ckpt", "random:qwen3-tiny", "--only", "grpo_graphs", "--steps", "2",
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    payload = json.loads((out / "gpu_check.json").read_text())
    (step,) = payload["steps"]
    assert step["status"] == "ok", step
    assert step["metrics"]["steps"] == 2.0
    assert step["metrics"]["decode_tokens_per_s"] > 0
    assert 0.5 < step["metrics"]["ratio_min"] <= step["metrics"]["ratio_max"] < 2.0
    assert "| grpo_graphs | ok |" in (out / "gpu_check.md").read_text()


def test_steps_left_when_the_budget_is_spent_are_skipped_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "cuda_problem", lambda: None)
    monkeypatch.setattr(gpu_check, "machine", lambda: {"gpu": "none"})
    ran = []

    def slow(ctx):
        ran.append(ctx.timeout_s)
        gpu_check.time.sleep(0.2)
        return StepResult("gpu_tests", "ok", 0.2)

    monkeypatch.setattr(gpu_check, "STEPS", (gpu_check.attrs.evolve(gpu_check.STEPS[0], run=slow),
                                             *gpu_check.STEPS[1:]))  # fmt: skip
    code = gpu_check.main(["--out", str(tmp_path), "--budget-s", "10.1"])
    assert code == 0 and len(ran) == 1 and ran[0] <= 10.1
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert [s["status"] for s in steps] == ["ok"] + ["skipped"] * (len(gpu_check.STEPS) - 1)
    assert steps[1]["reason"] == "the --budget-s of 10.1 s was spent"


def test_gpu_tests_leave_out_the_tests_of_plugins_that_are_not_installed(monkeypatch):
    # A plugin's conftest imports the plugin: collecting its tests without it fails the step.
    monkeypatch.setattr(gpu_check, "importable", lambda module: module != "areno_sglang")
    assert gpu_check.plugins_not_installed() == ["areno-sglang"]
    files = gpu_check.gpu_test_files()
    assert "tests/rollout/test_cuda_graphs.py" in files
    assert not [f for f in files if f.startswith("plugins/areno-sglang/")]

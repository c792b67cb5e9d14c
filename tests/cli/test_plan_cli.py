"""``areno plan``: a published model, explicit sizes, JSON output and bad input."""

from __future__ import annotations

import json

import pytest

from areno_core.cli.main import main

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


class Result:
    def __init__(self, code: int, output: str) -> None:
        self.code, self.output = code, output


@pytest.fixture
def run_areno(capsys):
    """``areno *argv`` in this process: its exit code and its output, whitespace collapsed
    (rich wraps tables to the terminal's width)."""

    def run(*argv: str, expect_error: bool = False) -> Result:
        try:
            main(list(argv))
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        assert (code != 0) == expect_error, (code, captured.out[-2000:], captured.err[-2000:])
        text = captured.out if not expect_error else captured.err
        return Result(code, text if "--json" in argv else " ".join(text.split()))

    return run


def test_plan_of_a_published_model_as_json(run_areno):
    result = run_areno(
        "plan", "--ckpt", "Qwen/Qwen3-8B", "--algo", "grpo", "--world-size", "8",
        "--max-prompt-tokens", "1024", "--max-new-tokens", "3072", "--max-running-prompts",
        "64", "--mini-bs", "2", "--json",
    )  # fmt: skip
    report = json.loads(result.output)
    assert report["parameters"] == 8_190_735_360
    gib = report["per_device_gib"]
    # float32 weights, gradients and AdamW moments, each split 8 ways
    assert gib["weights"] == pytest.approx(8_190_735_360 * 4 / 8 / 2**30)
    assert gib["optimizer state"] == pytest.approx(2 * gib["gradients"])
    assert report["rollout_gib"]["rollout KV cache"] == pytest.approx(
        64 * 4096 * (2 * 36 * 8 * 128 * 4 + 1) / 2**30
    )
    assert (
        report["largest_micro_batch_checkpointed"] >= report["largest_micro_batch_not_checkpointed"]
    )


def test_plan_from_sizes_prints_a_table_with_the_roles_of_the_algorithm(run_areno):
    result = run_areno(
        "plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--intermediate", "512",
        "--vocab", "1000", "--algo", "dpo", "--mini-bs", "2", "--max-prompt-tokens", "64",
        "--max-new-tokens", "64", "--gpu-mem", "1",
    )  # fmt: skip
    assert "reference model" in result.output
    assert "rollout KV cache" not in result.output  # dpo does not roll out
    assert "largest micro-batch within 0.9 GiB" in result.output


def test_plan_with_missing_sizes_or_bad_mesh_is_refused(run_areno):
    result = run_areno("plan", "--layers", "4", expect_error=True)
    assert "missing --hidden, --heads, --intermediate, --vocab" in result.output
    result = run_areno(
        "plan", "--ckpt", "random:qwen3-tiny", "--world-size", "4", "--dp-replicate", "3",
        expect_error=True,
    )  # fmt: skip
    assert "--dp-replicate 3 does not divide the 4 data-parallel ranks" in result.output

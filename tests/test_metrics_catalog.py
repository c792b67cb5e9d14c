"""Every metric in docs/observability.md's catalog is emitted by real runs, and vice versa."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from areno_core.cli.main import main
from areno_core.registry import set_registry

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "observability.md"
SFT_LOADER = REPO / "examples" / "sft" / "gsm8k_sft_loader.py"
SEEDED_AGENT = REPO / "tests" / "fixtures" / "seeded_agent.py"


def catalog() -> set[str]:
    text = DOC.read_text().split("## Metric catalog", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`((?:rollout|train|time|eval|memory)/[a-z_/]+)`", text))


def run_and_collect(args: list[str], out: Path) -> set[str]:
    """Run `areno train` and return every metric name it logged."""
    try:
        main(["train", *args, "--metrics-log-dir", str(out)])
    except SystemExit as exc:
        assert exc.code in (0, None)
    keys: set[str] = set()
    for line in (out / "metrics.jsonl").open():
        keys |= set(json.loads(line)) - {"step"}
    return keys


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> set[str]:
    set_registry(None)
    root = tmp_path_factory.mktemp("catalog")
    src = REPO / "data" / "gsm8k" / "train.jsonl"
    data = root / "rows.jsonl"
    with src.open() as f:
        data.write_text("".join(next(f) for _ in range(8)))
    (root / "rl.py").write_text("def load_row(row):\n    return {'prompt': row['question'][:32]}\n")
    (root / "dpo.py").write_text(
        "def load_row(row):\n    return {'prompt': row['question'][:32], "
        "'chosen': 'yes', 'rejected': 'no'}\n"
    )
    (root / "reward.py").write_text(
        "def reward_fn(record):\n    return float(len(record.completion) % 2)\n"
    )
    base = ["--ckpt", "random:qwen3-tiny", "--dataset-path", str(data), "--max-steps", "1",
            "--batch-size", "2", "--n-samples", "2", "--max-new-tokens", "6",
            "--no-activation-checkpointing", "--critic-warmup-steps", "0"]  # fmt: skip
    runs = {
        "sft": ["--dataset-loader-fn", str(SFT_LOADER), "--max-new-tokens", "32",
                "--eval-dataset-path", str(data), "--eval-limit", "2"],
        "dpo": ["--dataset-loader-fn", str(root / "dpo.py"), "--eval-dataset-path", str(data),
                "--eval-limit", "2"],
        "ppo": ["--dataset-loader-fn", str(root / "rl.py"), "--reward-fn-path",
                str(root / "reward.py"), "--eval-dataset-path", str(data), "--eval-limit", "2"],
    }  # fmt: skip
    runs["ppo-kl-in-reward"] = [*runs["ppo"], "--no-use-kl-loss", "--ref-ckpt", "random:qwen3-tiny"]
    keys: set[str] = set()
    for name, extra in runs.items():
        algo = name.split("-")[0]
        keys |= run_and_collect(["--algo", algo, *base, *extra], root / name)
    # 2 positions x 2 samples instead of the recipe's 16 x 8: the same metrics, 32x fewer turns
    agentic = ["--recipe", "agentic/tictactoe-cpu", "--algo", "grpo", "--max-steps", "1",
               "--batch-size", "2", "--n-samples", "2", "--mini-bs", "4"]  # fmt: skip
    keys |= run_and_collect(agentic, root / "agentic")
    # Asynchronous agentic rollout: the worker rolls out batches 1 and 2 together with the
    # first policy (rollout/inflight_batches), so step 2 trains on samples one version old.
    asynchronous = ["--algo", "grpo", *base, "--dataset-loader-fn", str(root / "rl.py"),
                    "--reward-fn-path", str(root / "reward.py"), "--max-steps", "2",
                    "--async-rollout", "--behaviour-weight-cap", "2", "--max-inflight-batches", "2",
                    "--agent-fn", str(SEEDED_AGENT)]  # fmt: skip
    keys |= run_and_collect(asynchronous, root / "async")
    # Steps filled by the first groups to finish (rollout/groups_*, rollout/buffered_groups).
    keys |= run_and_collect([*asynchronous, "--step-fill", "completion"], root / "fill")
    set_registry(None)
    return keys


def test_every_catalogued_metric_is_emitted(emitted):
    assert catalog() - emitted == set()


def test_every_emitted_metric_is_catalogued(emitted):
    assert emitted - catalog() == set()

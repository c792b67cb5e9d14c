"""Synchronous training is what it was before asynchronous rollout existed, bit for bit.

``tests/fixtures/sync_metrics.json`` holds the metrics (``time/*``, ``memory/*`` and rates
left out: they measure the machine) of short synchronous runs, with one torch thread. They were
first taken on the commit before ``--async-rollout`` landed (85e375a), and taken again when
the CPU defaults changed to the packed training forward and to one prompt copy per row for
short prompts (2026-11-27): both change numbers only in the last digits of the training
metrics (relative differences of at most 1e-5, apart from losses that are zero up to
rounding), and no sampled token or reward. A run repeats bit for bit only
on the same torch build, CPU instruction set and thread count, so the exact comparison runs
where the recorded CPU capability matches and the test says why it skipped elsewhere.
Recapture (only when a change is meant to alter synchronous training) with::

    python tests/test_sync_unchanged.py --capture
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "sync_metrics.json"
GSM8K = REPO / "data" / "gsm8k" / "train.jsonl"
REWARD = REPO / "tests" / "fixtures" / "digit_share_reward.py"

RL_LOADER = """
def load_row(row):
    return {"prompt": row["question"][:40], "answer": row["answer"].split("####")[-1].strip()}
"""


def run_args(name: str, root: Path) -> list[str]:
    """The ``areno train`` arguments of recorded run ``name``, with files under ``root``."""
    if name == "arith-gspo":
        return [
            "train", "--recipe", "math/arith", "--algo", "gspo", "--max-steps", "3",
            "--batch-size", "8", "--eval-limit", "24", "--eval-interval", "2",
        ]  # fmt: skip
    rows = root / "rows.jsonl"
    with GSM8K.open() as f:
        rows.write_text("".join(next(f) for _ in range(16)))
    (root / "loader.py").write_text(RL_LOADER)
    common = [
        "train", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(rows),
        "--dataset-loader-fn", str(root / "loader.py"), "--reward-fn-path",
        str(REWARD), "--batch-size", "4", "--n-samples", "4", "--mini-bs", "4",
        "--gradient-accumulation-steps", "1", "--max-new-tokens", "8", "--lr", "1e-3",
        "--no-activation-checkpointing", "--max-steps", "3",
    ]  # fmt: skip
    if name == "ppo":
        return [*common, "--algo", "ppo", "--critic-warmup-steps", "1"]
    if name == "grpo":
        return [*common, "--algo", "grpo"]
    raise ValueError(name)


RUNS = ("arith-gspo", "ppo", "grpo")


def record(name: str, root: Path) -> list[dict[str, float]]:
    """Run ``name`` with one torch thread; its metrics without ``time/*``."""
    from areno_core.registry import set_registry
    from areno_core.testing import run_areno

    root.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    set_registry(None)
    try:
        run_areno(*run_args(name, root), "--metrics-log-dir", str(root / "metrics"))
    finally:
        torch.set_num_threads(threads)
        set_registry(None)
    out = []
    for line in (root / "metrics" / "metrics.jsonl").open():
        row = json.loads(line)
        out.append({k: v for k, v in row.items() if not _timing(k)})
    return out


def _timing(key: str) -> bool:
    """Metrics that measure the machine, not the training (durations, rates, peak memory)."""
    return key.startswith(("time/", "memory/")) or key.endswith("_per_s")


def environment() -> dict[str, str]:
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability()}


def capture() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: record(name, Path(tmp) / name) for name in RUNS}
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps({"environment": environment(), "runs": runs}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


@pytest.mark.usefixtures("installed_plugins_only")
@pytest.mark.parametrize("name", RUNS)
def test_sync_run_metrics_equal_the_recorded_ones_exactly(tmp_path, name):
    saved = json.loads(FIXTURE.read_text())
    if saved["environment"] != environment():
        pytest.skip(
            f"recorded on {saved['environment']}, this is {environment()}: runs repeat bit for "
            "bit only on the same torch build and CPU instruction set"
        )
    assert record(name, tmp_path) == saved["runs"][name]


if __name__ == "__main__":
    if sys.argv[1:] != ["--capture"]:
        sys.exit("usage: python tests/test_sync_unchanged.py --capture")
    capture()

"""Draw the sampled reward of ``agentic/tictactoe-cpu`` runs and their checkpoints' evaluation.

    python -m areno_recipes_agentic.tictactoe.plot runs/ttt-grpo --label grpo \\
        --eval runs/ttt-grpo/eval.json --out runs/ttt-grpo/reward.png

Left: the moving average of ``rollout/reward_mean`` (``--window`` steps) of each run. Right:
from the JSON that ``python -m areno_recipes_agentic.tictactoe.evaluate --all-steps
--curve-out`` writes, the greedy held-out reward and the win rate against a random player at
each checkpoint. Needs matplotlib (``pip install 'areno-recipes-agentic[plot]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from areno_core.metrics.logger import moving_average


def reward_series(run: str | Path) -> tuple[list[int], list[float]]:
    """``(steps, rollout/reward_mean)`` from a run's ``metrics.jsonl``."""
    path = Path(run) / "tensorboard" / "metrics.jsonl"
    steps, rewards = [], []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "rollout/reward_mean" in row:
            steps.append(int(row["step"]))
            rewards.append(float(row["rollout/reward_mean"]))
    return steps, rewards


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_agentic.tictactoe.plot", description=__doc__.split("\n")[0]
    )
    parser.add_argument("runs", nargs="+", help="run directories (--save-path)")
    parser.add_argument("--label", action="append", default=[], help="one label per run")
    parser.add_argument("--eval", action="append", default=[], help="one eval JSON per run")
    parser.add_argument("--window", type=int, default=20, help="moving-average window")
    parser.add_argument("--out", required=True, help="PNG file to write")
    args = parser.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        parser.error("matplotlib is needed: pip install 'areno-recipes-agentic[plot]'")
    labels = args.label + [Path(r).name for r in args.runs[len(args.label) :]]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for run, label in zip(args.runs, labels, strict=True):
        steps, rewards = reward_series(run)
        left.plot(steps, moving_average(rewards, args.window), label=label)
    left.set_xlabel("step")
    left.set_ylabel(f"rollout/reward_mean ({args.window}-step mean, temperature 1)")
    left.set_title("sampled reward")
    left.grid(alpha=0.3)
    left.legend()
    for path, label in zip(args.eval, labels, strict=False):
        points = json.loads(Path(path).read_text())
        steps = [p["step"] for p in points]
        right.plot(steps, [p["positions/reward"] for p in points], "o-", label=f"{label}: reward")
        if all("games/win_rate" in p for p in points):
            wins = [p["games/win_rate"] for p in points]
            right.plot(steps, wins, "s--", label=f"{label}: win rate")
    right.set_xlabel("step")
    right.set_title("greedy, held-out positions / games vs random")
    right.set_ylim(0.0, 1.0)
    right.grid(alpha=0.3)
    if args.eval:
        right.legend()
    figure.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Plot a run's reward curve (and held-out accuracy, when given) to a PNG.

    python -m areno_recipes_math.plot runs/arith-gspo --out docs/img/arith_gspo.png
    python -m areno_recipes_math.plot runs/arith-gspo runs/arith-grpo \\
        --label gspo --label grpo --eval eval.json --out docs/img/arith_rl.png

Reads ``<run>/tensorboard/metrics.jsonl`` (or a ``metrics.jsonl`` path) and draws
``rollout/reward_mean`` per step with a moving average; the x axis is wall-clock minutes since
the first step when ``--time-axis`` is set. Held-out accuracy goes on a second axis: the
``eval/accuracy`` points a run logged itself (``--eval-dataset-path``, which ``math/arith``
sets), or, with ``--eval``, a JSON file of points ``{"label": [[step, accuracy], ...]}`` as
written by ``python -m areno_recipes_math.evaluate --all-steps --curve-out``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areno_core.metrics.logger import moving_average

METRICS_FILE = "metrics.jsonl"
MISSING_MATPLOTLIB = (
    "plotting needs matplotlib, which areno-recipes-math installs only with its 'plot' extra: "
    "pip install 'areno-recipes-math[plot]'"
)
REWARD_KEY = "rollout/reward_mean"
EVAL_KEY = "eval/accuracy"


def read_metrics(run: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (a run directory or the file itself)."""
    path = Path(run)
    if path.is_dir():
        nested = path / "tensorboard" / METRICS_FILE
        path = nested if nested.is_file() else path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} under {run}")
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def curve(
    rows: Sequence[dict[str, Any]], key: str = REWARD_KEY, *, time_axis: bool = False
) -> tuple[list[float], list[float]]:
    """``(x, y)`` of ``key``: x is the step, or minutes since the run began.

    A file that holds several runs (a metrics directory shared by runs without --save-path
    written by an older areno, or files concatenated by hand) is cut to the last run, from the
    last point where the step went back.
    """
    xs, ys, elapsed, last_step = [], [], 0.0, None
    for row in rows:
        step = int(row["step"])
        if last_step is not None and step <= last_step:
            xs, ys, elapsed = [], [], 0.0
        last_step = step
        elapsed += float(row.get("time/step", 0.0))
        if key not in row:
            continue
        xs.append(elapsed / 60.0 if time_axis else float(row["step"]))
        ys.append(float(row[key]))
    return xs, ys


def plot_runs(
    runs: Sequence[str | Path],
    out: str | Path,
    *,
    labels: Sequence[str] | None = None,
    key: str = REWARD_KEY,
    window: int = 10,
    time_axis: bool = False,
    eval_points: dict[str, list[tuple[float, float]]] | None = None,
    title: str | None = None,
) -> Path:
    """Draw the reward curve of each run (raw, faint; moving average, solid) into ``out``."""
    try:  # optional: the 'plot' extra
        import matplotlib
    except ImportError as exc:
        raise ImportError(MISSING_MATPLOTLIB) from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(labels or [Path(r).name for r in runs])
    if len(labels) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(labels)} labels")
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    logged: dict[str, list[tuple[float, float]]] = {}
    for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
        rows = read_metrics(run)
        eval_xs, eval_ys = curve(rows, EVAL_KEY, time_axis=time_axis)
        if eval_xs:
            logged[label] = list(zip(eval_xs, eval_ys, strict=True))
        xs, ys = curve(rows, key, time_axis=time_axis)
        color = colors[i % len(colors)]
        ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
        ax.plot(xs, moving_average(ys, window), color=color, linewidth=2.0, label=f"{label}")
    ax.set_xlabel("wall-clock minutes" if time_axis else "step")
    ax.set_ylabel(f"{key} ({window}-step mean)")
    ax.grid(alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    eval_points = eval_points if eval_points is not None else logged
    if eval_points:
        ax2 = ax.twinx()
        for i, (label, points) in enumerate(eval_points.items()):
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            # Same colour as the run of the same label, so a run and its accuracy pair up.
            index = labels.index(label) if label in labels else i
            style = {"color": colors[index % len(colors)], "linestyle": "--", "marker": "o"}
            ax2.plot(xs, ys, **style, label=f"{label} held-out accuracy")
        ax2.set_ylabel("held-out exact-match accuracy")
        top = max((p[1] for points in eval_points.values() for p in points), default=1.0)
        ax2.set_ylim(0.0, min(1.0, 0.1 * math.ceil(top * 12.5)))
        more_handles, more_names = ax2.get_legend_handles_labels()
        handles, names = handles + more_handles, names + more_names
    ax.legend(handles, names, loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_math.plot", description="Plot reward curves to a PNG."
    )
    parser.add_argument("runs", nargs="+", help="run directories or metrics.jsonl files")
    parser.add_argument("--out", required=True, help="PNG path")
    parser.add_argument("--label", action="append", default=None, help="one per run")
    parser.add_argument("--key", default=REWARD_KEY)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--time-axis", action="store_true", help="x axis in wall-clock minutes")
    parser.add_argument("--eval", default=None, help="JSON of held-out accuracy points")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401  (checked before any file is read)
    except ImportError:
        parser.exit(2, f"error: {MISSING_MATPLOTLIB}\n")
    eval_points = json.loads(Path(args.eval).read_text()) if args.eval else None
    written = plot_runs(
        args.runs,
        args.out,
        labels=args.label,
        key=args.key,
        window=args.window,
        time_axis=args.time_axis,
        eval_points=eval_points,
        title=args.title,
    )
    print(f"wrote {written}")


if __name__ == "__main__":
    main()

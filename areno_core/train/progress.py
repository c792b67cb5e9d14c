"""What a run shows while it trains, and the summary it prints at the end.

On a terminal :class:`TrainProgress` draws a live rich progress bar with the latest loss,
learning rate, throughput, reward and ETA. When the console is not a terminal (CI, files,
pipes) it prints a plain line instead, at most every ``plain_every_s`` seconds and always for
the first and the last step.

::

    with TrainProgress(total_steps=500, enabled=True, console=console) as progress:
        for step in range(start + 1, 501):
            metrics = train_one_step()
            progress.update(step, metrics)
    print_summary(console, steps=500, elapsed_s=..., final_metrics=metrics,
                  checkpoint_path=path, metrics_dir=log_dir)
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

# Where each displayed quantity is looked up in a step's metrics, first match wins.
LOSS_KEYS = ("train/loss",)
LR_KEYS = ("train/lr",)
REWARD_KEYS = ("rollout/reward_mean", "rollout/reward")
TOKENS_PER_S_KEYS = ("time/tokens_per_s", "train/tokens_per_s")
SAMPLES_PER_S_KEYS = ("time/samples_per_s", "train/samples_per_s")
TOKENS_KEYS = ("train/tokens", "train/num_tokens")
SAMPLES_KEYS = ("train/samples", "train/num_samples")
STEP_TIME_KEYS = ("time/step", "time/step_s")


def _pick(metrics: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = metrics.get(key)
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        return number
    return None


def _throughput(metrics: Mapping[str, Any]) -> tuple[float, str] | None:
    """(rate, unit) from explicit rates, else from counts over the step time."""
    tokens_rate = _pick(metrics, TOKENS_PER_S_KEYS)
    if tokens_rate is not None:
        return tokens_rate, "tok/s"
    samples_rate = _pick(metrics, SAMPLES_PER_S_KEYS)
    if samples_rate is not None:
        return samples_rate, "samples/s"
    step_time = _pick(metrics, STEP_TIME_KEYS)
    if step_time is None or not step_time > 0:
        return None
    tokens = _pick(metrics, TOKENS_KEYS)
    if tokens is not None:
        return tokens / step_time, "tok/s"
    samples = _pick(metrics, SAMPLES_KEYS)
    if samples is not None:
        return samples / step_time, "samples/s"
    return None


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4f}"


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}"


def format_stats(metrics: Mapping[str, Any]) -> str:
    """``loss=… lr=… reward=… 1234.5 tok/s`` from whichever of them ``metrics`` holds."""
    parts = []
    for label, keys in (("loss", LOSS_KEYS), ("lr", LR_KEYS), ("reward", REWARD_KEYS)):
        value = _pick(metrics, keys)
        if value is not None:
            parts.append(f"{label}={_fmt(value)}")
    rate = _throughput(metrics)
    if rate is not None:
        parts.append(f"{rate[0]:.1f} {rate[1]}")
    return " ".join(parts)


class TrainProgress:
    """Progress of the training loop; use as a context manager and call :meth:`update`.

    ``total_steps`` may be None when the run length is unknown (no bar, no ETA). With
    ``enabled=False`` nothing is shown. ``update`` never raises on missing or odd metrics.
    """

    def __init__(
        self,
        total_steps: int | None,
        enabled: bool,
        *,
        console: Console | None = None,
        plain_every_s: float = 10.0,
    ) -> None:
        self.total_steps = total_steps
        self.enabled = enabled
        self.console = console or Console()
        self.plain_every_s = plain_every_s
        self.live = enabled and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._start_time = 0.0
        self._start_step: int | None = None
        self._last_plain = -math.inf

    def __enter__(self) -> TrainProgress:
        self._start_time = time.monotonic()
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.total_steps, stats="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Show that ``step`` is done, with what ``metrics`` holds of loss, lr, reward, speed."""
        if not self.enabled:
            return
        metrics = metrics or {}
        if self._start_step is None:
            # The first update sets the origin, so a resumed run's ETA ignores earlier steps.
            self._start_step = step - 1
            if self._progress is not None:
                self._progress.reset(self._task, completed=self._start_step, total=self.total_steps)
        try:
            stats = format_stats(metrics)
        except Exception:  # display must never stop training
            stats = ""
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=stats)
            return
        now = time.monotonic()
        last = self.total_steps is not None and step >= self.total_steps
        first = step - 1 == self._start_step
        if not (first or last or now - self._last_plain >= self.plain_every_s):
            return
        self._last_plain = now
        self.console.print(self._plain_line(step, stats, now), highlight=False, markup=False)

    def _plain_line(self, step: int, stats: str, now: float) -> str:
        total = f"/{self.total_steps}" if self.total_steps is not None else ""
        line = f"step {step}{total}"
        if stats:
            line += f" {stats}"
        elapsed = now - self._start_time
        line += f" elapsed={_fmt_duration(elapsed)}"
        done = step - (self._start_step or 0)
        if self.total_steps is not None and done > 0:
            eta = elapsed / done * max(self.total_steps - step, 0)
            line += f" eta={_fmt_duration(eta)}"
        return line


def render_summary(summary: Mapping[str, Any]) -> RenderableType:
    """A two-column table of ``summary`` (label -> value); floats are shown compactly."""
    table = Table(title="Run summary", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    for label, value in summary.items():
        if value is None:
            continue
        text = _fmt(value) if isinstance(value, float) else str(value)
        table.add_row(str(label), text)
    return table


def print_summary(
    console: Console,
    *,
    steps: int,
    elapsed_s: float,
    final_metrics: Mapping[str, Any],
    checkpoint_path: str | None,
    metrics_dir: str | None,
    first_eval: Mapping[str, Any] | None = None,
    last_eval: Mapping[str, Any] | None = None,
) -> None:
    """Print the end-of-run summary: steps, time, final loss/reward/lr, held-out accuracy
    (first and last evaluation) when the run evaluated, where outputs are."""
    summary: dict[str, Any] = {"steps": steps, "elapsed": _fmt_duration(elapsed_s)}
    for label, keys in (
        ("final loss", LOSS_KEYS),
        ("final reward", REWARD_KEYS),
        ("final lr", LR_KEYS),
    ):
        summary[label] = _pick(final_metrics, keys)
    # Held-out accuracy (online RL) or loss (sft, dpo), first evaluation -> last.
    for label, key, fmt in (
        ("eval accuracy", "eval/accuracy", ".3f"),
        ("eval loss", "eval/loss", ".4g"),
    ):
        if last_eval and key in last_eval:
            last = format(last_eval[key], fmt)
            first = (first_eval or {}).get(key)
            moved = first is not None and first_eval is not last_eval
            summary[label] = f"{format(first, fmt)} -> {last}" if moved else last
            break
    summary["checkpoint"] = checkpoint_path or "none saved (no --save-path)"
    if metrics_dir:
        summary["metrics"] = metrics_dir
        summary["view with"] = f"tensorboard --logdir {metrics_dir}"
    console.print(render_summary(summary))

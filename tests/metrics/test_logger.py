"""Metrics (TensorBoard + jsonl), the section timer, and the progress display and summary."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rich.console import Console

from areno_core.metrics import logger as metrics_mod
from areno_core.metrics.logger import MetricsLogger, Timer, read_jsonl, read_scalars
from areno_core.train.progress import TrainProgress, format_stats, print_summary

STEPS = [
    {"train/loss": 2.5, "train/lr": 0.125, "rollout/reward_mean": 0.25},
    {"train/loss": 1.75, "train/lr": 0.0625, "time/step": 3.0},
    {"train/loss": 1.5, "eval/accuracy": 0.5},
]


def test_metrics_logger_round_trip_tensorboard_exact_steps_and_values(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        for step, row in enumerate(STEPS, start=1):
            logger.log(row, step=step)
    scalars = read_scalars(tmp_path)
    assert scalars == {
        "eval/accuracy": [(3, 0.5)],
        "rollout/reward_mean": [(1, 0.25)],
        "time/step": [(2, 3.0)],
        "train/loss": [(1, 2.5), (2, 1.75), (3, 1.5)],
        "train/lr": [(1, 0.125), (2, 0.0625)],
    }


def test_metrics_logger_jsonl_equals_history(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        for step, row in enumerate(STEPS, start=1):
            logger.log(row, step=step)
        history = logger.history
    expected = [{"step": i, **row} for i, row in enumerate(STEPS, start=1)]
    assert history == expected
    assert read_jsonl(tmp_path) == expected


def test_metrics_logger_tensor_and_int_values_become_numbers(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        logger.log({"train/loss": torch.tensor(0.75), "rollout/num_samples": 16}, step=4)
    assert read_jsonl(tmp_path) == [{"step": 4, "train/loss": 0.75, "rollout/num_samples": 16}]
    assert read_scalars(tmp_path)["rollout/num_samples"] == [(4, 16.0)]


@pytest.mark.parametrize("key", ["loss", "model/loss", "train/"])
def test_metrics_logger_key_without_namespace_raises(key: str) -> None:
    logger = MetricsLogger(None)
    with pytest.raises(ValueError, match="must start with one of train/, rollout/, time/, eval/"):
        logger.log({key: 1.0}, step=1)


def test_metrics_logger_no_dir_keeps_history_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    logger = MetricsLogger(None)
    logger.log({"train/loss": 1.0}, step=1)
    logger.close()
    assert logger.history == [{"step": 1, "train/loss": 1.0}]
    assert os.listdir(tmp_path) == []


def test_metrics_logger_resume_with_purge_step_replaces_rerun_steps(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        for step in (1, 2, 3):
            logger.log({"train/loss": float(step)}, step=step)
    # Checkpoint was at step 2; the resumed run logs steps 3 and 4 again.
    with MetricsLogger(tmp_path, purge_step=3) as logger:
        logger.log({"train/loss": 30.0}, step=3)
        logger.log({"train/loss": 40.0}, step=4)
    assert read_scalars(tmp_path)["train/loss"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert [(r["step"], r["train/loss"]) for r in read_jsonl(tmp_path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 30.0),
        (4, 40.0),
    ]


def test_timer_sections_accumulate_and_pop_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks: Iterator[float] = iter([10.0, 10.5, 20.0, 21.25, 30.0, 30.25])
    monkeypatch.setattr(metrics_mod.time, "perf_counter", lambda: next(ticks))
    timer = Timer()
    with timer("rollout"):
        pass
    with timer("rollout"):
        pass
    with timer("time/train"):
        pass
    assert timer.pop() == {"time/rollout": 1.75, "time/train": 0.25}
    assert timer.pop() == {}


def test_timer_section_raising_still_records(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks: Iterator[float] = iter([1.0, 3.0])
    monkeypatch.setattr(metrics_mod.time, "perf_counter", lambda: next(ticks))
    timer = Timer()
    with pytest.raises(RuntimeError), timer("reward"):
        raise RuntimeError("boom")
    assert timer.totals() == {"time/reward": 2.0}


# -- progress ---------------------------------------------------------------------------


def _plain_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200, force_terminal=False), buffer


def test_progress_non_tty_prints_plain_lines_with_values() -> None:
    console, buffer = _plain_console()
    with TrainProgress(3, enabled=True, console=console, plain_every_s=0.0) as progress:
        assert progress.live is False
        progress.update(
            1,
            {
                "train/loss": 0.5,
                "train/lr": 1e-6,
                "rollout/reward_mean": 0.75,
                "time/tokens_per_s": 1234.5,
            },
        )
        progress.update(2, {"train/loss": 0.25, "train/samples": 8, "time/step": 2.0})
        progress.update(3, {})
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("step 1/3 loss=0.5000 lr=1.000e-06 reward=0.7500 1234.5 tok/s ")
    assert lines[1].startswith("step 2/3 loss=0.2500 4.0 samples/s elapsed=")
    assert lines[2].startswith("step 3/3 elapsed=")
    assert "eta=" in lines[0]


def test_progress_non_tty_throttled_prints_first_and_last_only() -> None:
    console, buffer = _plain_console()
    with TrainProgress(5, enabled=True, console=console, plain_every_s=3600.0) as progress:
        for step in range(1, 6):
            progress.update(step, {"train/loss": float(step)})
    lines = buffer.getvalue().splitlines()
    assert [line.split(" elapsed")[0] for line in lines] == [
        "step 1/5 loss=1.0000",
        "step 5/5 loss=5.0000",
    ]


def test_progress_resumed_run_counts_from_first_update() -> None:
    console, buffer = _plain_console()
    with TrainProgress(None, enabled=True, console=console, plain_every_s=0.0) as progress:
        progress.update(41, {"train/loss": 0.125})
    assert buffer.getvalue().startswith("step 41 loss=0.1250 elapsed=0:00:00")
    assert "eta" not in buffer.getvalue()


def test_progress_odd_metrics_do_not_crash() -> None:
    console, buffer = _plain_console()
    odd = {"train/loss": "n/a", "train/lr": None, "time/step": 0.0, "train/tokens": 5}
    with TrainProgress(2, enabled=True, console=console, plain_every_s=0.0) as progress:
        progress.update(1, odd)
        progress.update(2, {"train/loss": float("nan")})
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("step 1/2 elapsed=")
    assert lines[1].startswith("step 2/2 loss=nan ")


def test_progress_disabled_prints_nothing() -> None:
    console, buffer = _plain_console()
    with TrainProgress(2, enabled=False, console=console, plain_every_s=0.0) as progress:
        progress.update(1, {"train/loss": 1.0})
    assert buffer.getvalue() == ""


def test_progress_tty_live_bar_shows_stats() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, force_terminal=True, color_system=None)
    with TrainProgress(4, enabled=True, console=console) as progress:
        assert progress.live is True
        progress.update(1, {"train/loss": 0.5})
        progress.update(2, {"train/loss": 0.375, "train/lr": 0.001})
    out = buffer.getvalue()
    assert "2/4" in out
    assert "loss=0.3750 lr=0.0010" in out


def test_format_stats_prefers_explicit_rate() -> None:
    stats = format_stats({"time/samples_per_s": 12.0, "train/tokens": 100, "time/step": 1.0})
    assert stats == "12.0 samples/s"


def test_format_stats_train_tokens_rate_shown_as_tok_s() -> None:
    assert format_stats({"train/loss": 1.0, "train/tokens_per_s": 250.0}) == (
        "loss=1.0000 250.0 tok/s"
    )


def test_print_summary_contains_checkpoint_path_and_final_loss(tmp_path: Path) -> None:
    console, buffer = _plain_console()
    ckpt = str(tmp_path / "run" / "step_200")
    print_summary(
        console,
        steps=200,
        elapsed_s=3725.0,
        final_metrics={"train/loss": 0.1234, "rollout/reward_mean": 0.875},
        checkpoint_path=ckpt,
        metrics_dir=str(tmp_path / "run" / "tensorboard"),
    )
    out = buffer.getvalue()
    assert ckpt in out
    assert "final loss" in out and "0.1234" in out
    assert "final reward" in out and "0.8750" in out
    assert "1:02:05" in out
    assert f"tensorboard --logdir {tmp_path / 'run' / 'tensorboard'}" in out
    assert "final lr" not in out


def test_print_summary_without_save_path_says_none_saved() -> None:
    console, buffer = _plain_console()
    print_summary(
        console,
        steps=3,
        elapsed_s=1.0,
        final_metrics={},
        checkpoint_path=None,
        metrics_dir=None,
    )
    assert "none saved" in buffer.getvalue()

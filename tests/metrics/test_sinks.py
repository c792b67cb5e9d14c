"""Metric sinks: ``--report-to`` parsing and checks, built-in sinks, and a sink plugin that
receives a short run's config, every metric at its step and the final checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areno_core.cli.main import main
from areno_core.errors import ConfigError
from areno_core.metrics.logger import MetricsLogger, read_jsonl, read_scalars
from areno_core.metrics.sinks import (
    JSONL_SINK,
    RunInfo,
    SinkSpec,
    check_sinks,
    flat_config,
    open_sinks,
    parse_report_to,
)
from areno_core.registry import get_registry
from areno_core.testing import run_areno

REPO = Path(__file__).resolve().parents[2]
SFT_LOADER = REPO / "examples" / "sft" / "gsm8k_sft_loader.py"

# A sink plugin (its register_metric_sinks hook) with a sink that records every call and a sink
# that is never ready.
RECORDING_PACK = (REPO / "tests" / "fixtures" / "recording_sink_pack.py").read_text()


@pytest.fixture
def recording(install_areno_plugin, monkeypatch, tmp_path) -> Path:
    monkeypatch.delenv("ARENO_PLUGINS", raising=False)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("RECORD_SINK_FILE", str(record))
    install_areno_plugin("recording-pack", "recording_pack", RECORDING_PACK)
    return record


@pytest.fixture
def sft_rows(tmp_path) -> Path:
    rows = tmp_path / "rows.jsonl"
    with (REPO / "data" / "gsm8k" / "train.jsonl").open() as f:
        rows.write_text("".join(next(f) for _ in range(8)))
    return rows


def sft_args(rows: Path, run: Path, *extra: str) -> list[str]:
    return [
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(rows),
        "--dataset-loader-fn", str(SFT_LOADER), "--batch-size", "4", "--mini-bs", "4",
        "--max-new-tokens", "32", "--no-activation-checkpointing", "--max-steps", "2",
        "--save-path", str(run), *extra,
    ]  # fmt: skip


def test_parse_report_to_always_keeps_jsonl_first_and_once() -> None:
    assert parse_report_to("tensorboard") == ["jsonl", "tensorboard"]
    assert parse_report_to(" wandb , tensorboard,wandb ") == ["jsonl", "wandb", "tensorboard"]
    assert parse_report_to("none") == ["jsonl"]
    with pytest.raises(ConfigError, match="'none' cannot be combined"):
        parse_report_to("none,wandb")


def test_check_sinks_names_the_missing_package_and_the_unready_sink() -> None:
    with pytest.raises(ConfigError, match=r"--report-to 'wandbb'.*pip install 'areno-trackers"):
        check_sinks(["wandbb"], get_registry().sink)
    unready = SinkSpec("x", "x", lambda run: None, lambda: "not logged in")
    with pytest.raises(ConfigError, match="--report-to x: not logged in"):
        check_sinks(["x"], lambda name: unready)


def test_open_sinks_closes_the_opened_ones_when_a_later_one_fails(tmp_path) -> None:
    closed = []

    class Closing:
        def __init__(self, run):
            pass

        def close(self):
            closed.append(True)

    def broken(run):
        raise RuntimeError("cannot reach the tracker")

    run = RunInfo("r", tmp_path, tmp_path)
    with pytest.raises(RuntimeError, match="cannot reach"):
        open_sinks([SinkSpec("a", "a", Closing), SinkSpec("b", "b", broken)], run)
    assert closed == [True]


def test_builtin_sinks_write_jsonl_and_tensorboard_and_purge_on_resume(tmp_path) -> None:
    run = RunInfo("r", tmp_path, tmp_path)
    specs = check_sinks(parse_report_to("tensorboard"), get_registry().sink)
    with MetricsLogger(None, sinks=open_sinks(specs, run)) as metrics:
        for step in (1, 2, 3):
            metrics.log({"train/loss": 1.0 / step}, step)
        metrics.finish("/ckpt/step_3")
    resumed = RunInfo("r", tmp_path, tmp_path, purge_step=3)
    with MetricsLogger(None, sinks=open_sinks([JSONL_SINK], resumed)) as metrics:
        metrics.log({"train/loss": 0.25}, 3)
    assert [(r["step"], r["train/loss"]) for r in read_jsonl(tmp_path)] == [
        (1, 1.0), (2, 0.5), (3, 0.25)
    ]  # fmt: skip
    assert [s for s, _ in read_scalars(tmp_path)["train/loss"]] == [1, 2, 3]


def test_flat_config_joins_sections_with_dots() -> None:
    assert flat_config({"train": {"lr": 0.1, "opt": {"b": 2}}, "seed": 0}) == {
        "train.lr": 0.1, "train.opt.b": 2, "seed": 0
    }  # fmt: skip


def test_sink_plugin_gets_config_every_metric_and_the_final_checkpoint(
    recording, sft_rows, tmp_path
) -> None:
    run = tmp_path / "run"
    run_areno(*sft_args(sft_rows, run, "--report-to", "recording", "--save-interval", "1"))
    events = [json.loads(line) for line in recording.read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "log", "log", "finish", "close"]
    start = events[0]
    assert start["name"] == "run" and start["output"] == str(run)
    assert start["config"]["basic"]["algo"] == "sft" and start["config"]["train"]["mini_bs"] == 4
    logged = read_jsonl(run / "tensorboard")
    assert [(e["step"], e["metrics"]) for e in events[1:3]] == [
        (row["step"], {k: v for k, v in row.items() if k != "step"}) for row in logged
    ]
    assert events[3]["checkpoint"] == str(run / "step_2")
    # --report-to recording replaced tensorboard: no event files, metrics.jsonl as always
    assert not list((run / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    ("report_to", "message"),
    [
        ("locked", "--report-to locked: not logged in to Locked: run `locked login`"),
        ("tensorboard,nosuch", "--report-to 'nosuch': unknown metric sink 'nosuch'"),
        ("bad name", "--report-to 'bad name': expected comma-separated sink names"),
    ],
)
def test_failing_sink_stops_the_run_before_anything_is_written(
    recording, sft_rows, tmp_path, capsys, report_to, message
) -> None:
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(sft_args(sft_rows, run, "--report-to", report_to))
    assert exc.value.code == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not run.exists() and not recording.exists()

"""Each tracker, offline: a short ``areno train --report-to wandb,mlflow,trackio`` leaves the
run's config, every metric at its step and the final checkpoint path in W&B's offline run
directory, an MLflow file store and trackio's local database; a tracker that cannot run stops
the command before training."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from areno_trackers import common, mlflow_sink, wandb_sink
from areno_trackers.wandb_offline import read_run

from areno_core.cli.main import main
from areno_core.metrics.logger import read_jsonl
from areno_core.registry import get_registry
from areno_core.testing import run_areno

REPO = Path(__file__).resolve().parents[3]
SFT_LOADER = REPO / "examples" / "sft" / "gsm8k_sft_loader.py"

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


def sft_args(rows: Path, run: Path, *extra: str) -> list[str]:
    return [
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(rows),
        "--dataset-loader-fn", str(SFT_LOADER), "--batch-size", "4", "--mini-bs", "4",
        "--max-new-tokens", "32", "--no-activation-checkpointing", "--max-steps", "3",
        "--save-interval", "2", "--save-path", str(run), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """One short run reported to all three trackers, offline."""
    from areno_core.registry import set_registry

    root = tmp_path_factory.mktemp("trackers")
    rows = root / "rows.jsonl"
    with (REPO / "data" / "gsm8k" / "train.jsonl").open() as f:
        rows.write_text("".join(next(f) for _ in range(12)))
    paths = {"run": root / "tracked-run", "wandb": root / "wandb", "mlruns": root / "mlruns",
             "trackio": root / "trackio"}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ARENO_PLUGINS", raising=False)
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_DIR", str(paths["wandb"]))
        mp.setenv("MLFLOW_TRACKING_URI", f"file:{paths['mlruns']}")
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # restored afterwards
        mp.setenv("TRACKIO_DIR", str(paths["trackio"]))
        mp.setenv("TRACKIO_PROJECT", "areno-test")
        set_registry(None)
        paths["wandb"].mkdir()
        run_areno(*sft_args(rows, paths["run"], "--report-to", "wandb,mlflow,trackio"))
        yield paths
    set_registry(None)


def logged(run: Path) -> list[dict]:
    return read_jsonl(run / "tensorboard")


def test_wandb_offline_run_holds_config_metrics_and_checkpoint(tracked) -> None:
    [path] = tracked["wandb"].glob("wandb/offline-run-*/run-*.wandb")
    record = read_run(path)
    assert record["config"]["basic"]["algo"] == "sft"
    assert record["config"]["train"]["mini_bs"] == 4
    history = [{k: v for k, v in h.items() if not k.startswith("_")} | {"step": h["_step"]}
               for h in record["history"]]  # fmt: skip
    assert history == logged(tracked["run"])
    assert record["summary"]["checkpoint_path"] == str(tracked["run"] / "step_3")


def test_mlflow_file_store_holds_params_metrics_and_checkpoint(tracked) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracked["mlruns"].as_uri())
    experiment = client.get_experiment_by_name("areno")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tracked-run" and run.info.status == "FINISHED"
    assert run.data.params["basic.algo"] == "sft" and run.data.params["train.mini_bs"] == "4"
    assert run.data.tags["areno.checkpoint_path"] == str(tracked["run"] / "step_3")
    rows = logged(tracked["run"])
    for key in ("train/loss", "train/lr", "time/step"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [
            (row["step"], pytest.approx(row[key])) for row in rows
        ]


def test_trackio_local_run_holds_config_metrics_and_checkpoint(tracked) -> None:
    from trackio import SQLiteStorage

    config = SQLiteStorage.get_run_config("areno-test", "tracked-run")
    assert config["basic.algo"] == "sft" and config["train.mini_bs"] == 4
    logs = SQLiteStorage.get_logs("areno-test", "tracked-run")
    metrics = [
        {k: v for k, v in entry.items() if k != "timestamp"}
        for entry in logs
        if "checkpoint_path" not in entry
    ]
    assert metrics == logged(tracked["run"])
    [final] = [entry for entry in logs if "checkpoint_path" in entry]
    assert final["checkpoint_path"] == str(tracked["run"] / "step_3") and final["step"] == 3


def test_sinks_registered_by_the_package() -> None:
    assert {"wandb", "mlflow", "trackio"} <= set(get_registry().names("metric_sinks"))


def test_wandb_without_a_key_stops_before_training(tmp_path, monkeypatch, capsys) -> None:
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(sft_args(tmp_path / "unread.jsonl", run, "--report-to", "wandb"))
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--report-to wandb: not logged in to Weights & Biases: run `wandb login`" in err
    assert not run.exists()


def test_a_tracker_that_is_not_installed_names_its_extra(monkeypatch) -> None:
    real = common.importlib.util.find_spec
    monkeypatch.setattr(
        common.importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("wandb", "mlflow") else real(name, *a),
    )
    assert wandb_sink.check_wandb() == (
        "wandb is not installed: pip install 'areno-trackers[wandb]'"
    )
    assert "pip install 'areno-trackers[mlflow]'" in mlflow_sink.check_mlflow()


def test_mlflow_database_uri_without_sqlalchemy_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    real = mlflow_sink.importlib.util.find_spec
    monkeypatch.setattr(
        mlflow_sink.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sqlalchemy" else real(name, *a),
    )
    assert "needs the full MLflow package" in mlflow_sink.check_mlflow()
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///mlflow.db"

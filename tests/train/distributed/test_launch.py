"""The launcher's side of a distributed run, without starting processes: when it launches,
what it checks first, and how a failed worker is reported."""

from __future__ import annotations

import signal

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from transformers import GPT2Config

from areno_core.config import build_config
from areno_core.errors import ConfigError
from areno_core.train.distributed import launch
from areno_core.train.distributed.context import init_distributed, launched_world_size

TORCHRUN_ENV = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29999",
}


@pytest.fixture
def no_launcher(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def test_launched_world_size_reads_torchrun_environment(monkeypatch, no_launcher):
    assert launched_world_size() is None and not launch.in_worker()
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert launched_world_size() == 2 and launch.in_worker()


def test_worker_and_world_of_one_do_not_launch(monkeypatch, no_launcher):
    assert launch.launch_workers(build_config({"world_size": 1}), ["train"]) is False
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert launch.launch_workers(build_config({"world_size": 2}), ["train"]) is False


def test_world_size_without_a_launcher_is_a_clear_error(no_launcher):
    with pytest.raises(ConfigError, match="this process was not started by torch's launcher"):
        init_distributed(world_size=2, tp_size=1, timeout_s=5)


def test_world_size_other_than_the_launchers_is_a_clear_error(monkeypatch):
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="--world-size 4 does not match the 2 processes"):
        init_distributed(world_size=4, tp_size=1, timeout_s=5)


def test_tp_size_for_a_family_without_a_plan_fails_before_any_worker_starts(tmp_path):
    GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path)
    config = build_config({"world_size": 2, "tp_size": 2, "ckpt": str(tmp_path)})
    with pytest.raises(ConfigError, match="is a gpt2 model; tensor-parallel plans exist for"):
        launch.launch_workers(config, ["train"])


def test_failure_names_the_first_rank_and_its_recorded_error(tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    launch.record_worker_error(ValueError("bad row 7"))
    failures = {
        0: ProcessFailure(local_rank=0, pid=10, exitcode=-signal.SIGTERM, error_file=""),
        1: ProcessFailure(local_rank=1, pid=11, exitcode=2, error_file=str(error_file)),
    }
    assert launch.describe_failure(failures) == (
        "the distributed run stopped: rank 1 failed (exit code 2): ValueError: bad row 7 "
        "(1 other process(es) stopped with it)"
    )


def test_failure_by_signal_and_without_an_error_file():
    killed = {3: ProcessFailure(local_rank=1, pid=12, exitcode=-signal.SIGKILL, error_file="")}
    assert launch.describe_failure(killed) == (
        "the distributed run stopped: rank 3 was killed by signal SIGKILL"
    )
    crashed = {0: ProcessFailure(local_rank=0, pid=13, exitcode=1, error_file="")}
    assert launch.describe_failure(crashed) == (
        "the distributed run stopped: rank 0 exited with code 1 (its error is printed above)"
    )


def test_killed_rank_is_named_before_a_rank_that_failed_in_a_collective_after_it():
    # Rank 0 lost its peer and recorded its gloo error a moment before the launcher saw rank 1.
    failures = {
        0: ProcessFailure(local_rank=0, pid=10, exitcode=1, error_file=""),
        1: ProcessFailure(local_rank=1, pid=11, exitcode=-signal.SIGKILL, error_file=""),
    }
    failures[0].timestamp, failures[1].timestamp = 100, 101
    assert launch.describe_failure(failures) == (
        "the distributed run stopped: rank 1 was killed by signal SIGKILL "
        "(1 other process(es) stopped with it)"
    )


def test_worker_traceback_goes_to_its_rank_log_and_the_failure_names_the_folder(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(launch.WORKER_LOG_ENV, str(tmp_path / "logs"))
    for name, value in TORCHRUN_ENV.items():  # rank 1 of 2
        monkeypatch.setenv(name, value)
    try:
        raise RuntimeError("Connection reset by peer")
    except RuntimeError as exc:
        path = launch.log_worker_traceback(exc)
    assert path == tmp_path / "logs" / "rank1.log"
    text = path.read_text()
    assert text.startswith("--- rank 1, pid ")
    assert "Traceback (most recent call last)" in text
    assert text.rstrip().endswith("RuntimeError: Connection reset by peer")
    crashed = {1: ProcessFailure(local_rank=1, pid=13, exitcode=1, error_file="")}
    assert launch.describe_failure(crashed, log_dir=tmp_path / "logs") == (
        "the distributed run stopped: rank 1 exited with code 1 (its error is in its log); "
        f"the workers' tracebacks are in {tmp_path / 'logs'}"
    )


def test_no_traceback_log_outside_a_launched_worker(tmp_path, monkeypatch, no_launcher):
    monkeypatch.setenv(launch.WORKER_LOG_ENV, str(tmp_path))
    assert launch.log_worker_traceback(RuntimeError("x")) is None  # not a worker
    assert list(tmp_path.iterdir()) == []


def test_worker_log_dir_is_in_the_run_directory():
    assert str(launch.worker_log_dir(build_config({"save_path": "runs/a"}))) == "runs/a/logs"
    assert str(launch.worker_log_dir(build_config({"metrics_log_dir": "m"}))) == "m/logs"
    assert str(launch.worker_log_dir(build_config({}))) == "runs/logs"


@pytest.mark.parametrize(("world_size", "cores", "warns"), [(2, 2, False), (4, 2, True)])
def test_more_processes_than_cpu_cores_warns_naming_both(world_size, cores, warns):
    warning = launch.cpu_oversubscription(world_size, cores)
    assert (warning is not None) == warns
    if warns:
        assert warning.startswith(
            "--world-size 4 starts 4 worker processes on this machine's 2 CPU core(s)"
        )


def test_check_launch_warns_on_a_cpu_machine_with_fewer_cores(monkeypatch, caplog):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 2)
    with caplog.at_level("WARNING", logger="areno"):
        launch.check_launch(build_config({"world_size": 4, "tp_size": 1}))
        launch.check_launch(build_config({"world_size": 2, "tp_size": 1}))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "--world-size 4 starts 4 worker processes" in warnings[0]


def test_dp_replicate_that_does_not_divide_the_data_parallel_ranks_is_refused():
    from areno_core.train.distributed import DISTRIBUTED_BACKEND
    from areno_core.train.distributed.context import check_mesh_shape

    assert check_mesh_shape(8, 2, 2) is None  # 2 groups of 2 dp ranks, each of tp 2
    config = build_config({"world_size": 8, "tp_size": 2})
    config.plugin["dp_replicate"] = 3
    assert DISTRIBUTED_BACKEND.check(config) == (
        "--dp-replicate 3 does not divide the 4 data-parallel ranks (--world-size 8 / "
        "--tp-size 2); give a divisor of 4, such as the number of nodes"
    )
    config.plugin["dp_replicate"] = 2
    assert DISTRIBUTED_BACKEND.check(config) is None

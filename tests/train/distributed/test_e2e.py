"""``areno train --world-size 2`` end to end: launch, resume on another world size, faults,
and the multi-node form (two torchrun "nodes" on this machine). CPU, gloo."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from areno_core.testing import run_areno
from areno_core.train.checkpoint import find_latest_checkpoint, missing_files, read_weights

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("installed_plugins_only")]

SFT_LOADER = """
import os

def load_row(row):
    if os.environ.get("RANK") == "1" and os.environ.get("FAIL_ON_RANK_1"):
        raise ValueError("rank one cannot read this row")
    return {"prompt": row["question"][:48], "response": row["answer"][:48]}
"""


@pytest.fixture
def files(tmp_path, write_rl_files) -> dict[str, Path]:
    rows = tmp_path / "rows.jsonl"
    with (REPO / "data" / "gsm8k" / "train.jsonl").open() as f:
        rows.write_text("".join(next(f) for _ in range(48)))
    rl, reward = write_rl_files(tmp_path, 40)
    sft = tmp_path / "sft.py"
    sft.write_text(SFT_LOADER)
    return {"rows": rows, "rl": rl, "reward": reward, "sft": sft}


def grpo_args(files: dict[str, Path], run: Path, *extra: str) -> list[str]:
    return [
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(files["rows"]), "--dataset-loader-fn", str(files["rl"]),
        "--reward-fn-path", str(files["reward"]), "--batch-size", "4", "--n-samples", "3",
        "--mini-bs", "3", "--max-new-tokens", "12", "--lr", "5e-4", "--save-path", str(run),
        *extra,
    ]  # fmt: skip


def sft_args(files: dict[str, Path], run: Path, *extra: str) -> list[str]:
    return [
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(files["rows"]), "--dataset-loader-fn", str(files["sft"]),
        "--batch-size", "4", "--mini-bs", "2", "--lr", "5e-4", "--save-path", str(run),
        *extra,
    ]  # fmt: skip


def areno_process(args: list[str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, **kwargs.pop("env", {})}
    return subprocess.Popen(
        [sys.executable, "-m", "areno_core.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs,
    )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]


def assert_same_weights(a: Path, b: Path, atol: float = 1e-5) -> None:
    wa, wb = read_weights(a), read_weights(b)
    assert set(wa) == set(wb)
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst < atol, worst


@pytest.mark.timeout(420)
def test_two_processes_grpo_then_resume_on_one_process_continues_exactly(tmp_path, files):
    run, uninterrupted = tmp_path / "run", tmp_path / "uninterrupted"
    first = areno_process(grpo_args(files, run, "--world-size", "2", "--max-steps", "2"))
    whole = areno_process(grpo_args(files, uninterrupted, "--world-size", "2", "--max-steps", "4"))
    for proc in (first, whole):
        code, output = finish(proc, timeout=360)
        assert code == 0, output[-4000:]
    step2 = run / "step_2"
    assert (step2 / "sharded" / ".metadata").is_file() and not missing_files(step2)
    assert [h["rollout/samples"] for h in history(run)] == [12.0, 12.0]  # every prompt's
    # The same command on one process from there: the local backend reads the shards (a
    # resumed run keeps the saved --world-size unless told otherwise).
    run_areno(
        *grpo_args(files, run, "--max-steps", "4", "--resume", "auto", "--no-share-prefix"),
        "--world-size", "1",
    )  # fmt: skip
    assert_same_weights(run / "step_4", uninterrupted / "step_4")
    resumed, reference = history(run), history(uninterrupted)
    assert [h["step"] for h in resumed] == [1, 2, 3, 4]
    for got, want in zip(resumed, reference, strict=True):
        # The same samples (the same rewards), and the same losses up to rounding.
        assert got["rollout/reward_mean"] == want["rollout/reward_mean"]
        assert got["train/loss"] == pytest.approx(want["train/loss"], abs=1e-6)
        assert got["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_one_process_checkpoint_resumes_on_two_processes(tmp_path, files):
    """A local checkpoint (full weights and optimizer state) is sharded on resume."""
    run, uninterrupted = tmp_path / "run", tmp_path / "uninterrupted"
    extra = ("--algo", "ppo", "--critic-warmup-steps", "0", "--n-samples", "2", "--mini-bs", "2")
    run_areno(*grpo_args(files, run, "--max-steps", "2", "--no-share-prefix", *extra))
    resumed = areno_process(
        grpo_args(files, run, "--max-steps", "3", "--world-size", "2", "--resume", "auto", *extra)
    )
    code, output = finish(resumed, timeout=360)
    assert code == 0, output[-4000:]
    run_areno(*grpo_args(files, uninterrupted, "--max-steps", "3", "--no-share-prefix", *extra))
    assert (run / "step_3" / "sharded" / ".metadata").is_file()
    assert_same_weights(run / "step_3", uninterrupted / "step_3")
    assert_same_weights(run / "step_3" / "critic", uninterrupted / "step_3" / "critic")
    for got, want in zip(history(run), history(uninterrupted), strict=True):
        assert got["rollout/reward_mean"] == want["rollout/reward_mean"]
        assert got["train/loss"] == pytest.approx(want["train/loss"], abs=1e-6)


@pytest.mark.timeout(240)
def test_rank_that_raises_ends_the_run_with_its_rank_and_error(tmp_path, files):
    started = time.monotonic()
    proc = areno_process(
        sft_args(files, tmp_path / "run", "--world-size", "2", "--max-steps", "2"),
        env={"FAIL_ON_RANK_1": "1"},
    )
    code, output = finish(proc, timeout=200)
    assert code != 0
    text = " ".join(output.split())
    assert "the distributed run stopped: rank 1 failed (exit code 2)" in text
    assert "rank one cannot read this row" in text
    assert time.monotonic() - started < 200


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform != "linux", reason="finds the worker in /proc")
def test_killed_rank_ends_the_run_and_leaves_only_complete_checkpoints(tmp_path, files):
    run = tmp_path / "run"
    proc = areno_process(sft_args(files, run, "--world-size", "2", "--save-interval", "1"))
    metrics = run / "tensorboard" / "metrics.jsonl"
    deadline = time.monotonic() + 200
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None, finish(proc, 10)[1][-3000:]
        assert time.monotonic() < deadline, "the run never got to step 2"
        time.sleep(0.2)
    victim = worker_pid(proc.pid, rank=1)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    code, output = finish(proc, timeout=120)
    assert code != 0
    assert time.monotonic() - killed < 90  # bounded: the launcher stops the survivor
    text = " ".join(output.split())
    assert "rank 1 was killed by signal SIGKILL" in text
    # The survivor's gloo traceback is kept in the run's log, not printed: one line says
    # what happened and where the tracebacks are. Which comes first is a race: the survivor's
    # collective failing (it logs its traceback), or the launcher's SIGTERM while it still waits
    # (it leaves none). Either way the message must match what is on disk.
    assert "[rank0]:" not in output and "Traceback" not in output, output[-3000:]
    log = run / "logs" / "rank0.log"
    pointer = f"the workers' tracebacks are in {run / 'logs'}"
    if log.is_file() and log.stat().st_size > 0:
        assert pointer in text, text[-2000:]
        assert "Traceback (most recent call last)" in log.read_text()
    else:
        assert pointer not in text, text[-2000:]
    steps = [p for p in run.iterdir() if p.name.startswith("step_")]
    assert steps and all(not missing_files(p) for p in steps)
    assert find_latest_checkpoint(run) in steps


def worker_pid(parent: int, *, rank: int) -> int:
    """The pid of the worker of ``rank`` among ``parent``'s children (Linux /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no worker of rank {rank} under pid {parent}")


def torchrun_node(rank: int, port: int, args: list[str]) -> subprocess.Popen:
    """One torchrun "node" of two (one process each) running ``areno`` with ``args``."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}",
        "-m", "areno_core.cli", *args,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.timeout(420)
def test_two_torchrun_nodes_on_localhost_train_like_one_process(tmp_path, files):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run, reference = tmp_path / "run", tmp_path / "reference"
    # No --world-size: under torchrun the launcher's WORLD_SIZE sets it.
    args = sft_args(files, run, "--max-steps", "3")
    nodes = [torchrun_node(rank, port, args) for rank in (0, 1)]
    outputs = [node.communicate(timeout=360)[0] for node in nodes]
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-4000:]
    assert "world_size: 2" in (run / "config.yaml").read_text()
    assert len(history(run)) == 3
    run_areno(*sft_args(files, reference, "--max-steps", "3", "--no-share-prefix"))
    assert_same_weights(run / "step_3", reference / "step_3")
    torch.testing.assert_close(
        [h["train/loss"] for h in history(run)],
        [h["train/loss"] for h in history(reference)],
        atol=1e-5,
        rtol=0,
    )


RECORDING_SINK = (REPO / "tests" / "fixtures" / "recording_sink_pack.py").read_text()


@pytest.mark.timeout(300)
def test_only_rank_zero_reports_to_metric_sinks(tmp_path, files):
    from areno_core.testing import write_distribution

    site = tmp_path / "site"
    site.mkdir()
    write_distribution(site, "recording-pack", "recording_pack", RECORDING_SINK)
    record, run = tmp_path / "record.jsonl", tmp_path / "run"
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "RECORD_SINK_FILE": str(record),
    }
    args = sft_args(files, run, "--world-size", "2", "--max-steps", "2", "--report-to", "recording")
    code, output = finish(areno_process(args, env=env), timeout=240)
    assert code == 0, output
    events = [json.loads(line) for line in record.read_text().splitlines()]
    assert {e["rank"] for e in events} == {"0"}  # rank 1 trained too, and reported nothing
    assert [e["event"] for e in events] == ["start", "log", "log", "finish", "close"]
    assert [e["step"] for e in events if e["event"] == "log"] == [1, 2]
    assert events[3]["checkpoint"] == str(run / "step_2")

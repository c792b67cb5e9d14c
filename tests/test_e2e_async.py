"""``areno train --async-rollout`` end to end: rollout in a worker process, the staleness bound,
K = 0 as synchronous training, agentic rollout, resuming, and a worker that dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from areno_core.testing import areno_exit_code, run_areno

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

REPO = Path(__file__).resolve().parent.parent
GSM8K = REPO / "data" / "gsm8k" / "train.jsonl"
# Metrics only an asynchronous run writes (the rest must equal a synchronous run's at K = 0).
ASYNC_ONLY = {
    "rollout/staleness_mean",
    "rollout/staleness_max",
    "rollout/stale_dropped",
    "rollout/buffered_batches",
}


def _timing(key: str) -> bool:
    return key.startswith(("time/", "memory/")) or key.endswith("_per_s")


def history(metrics_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (metrics_dir / "metrics.jsonl").open()]


@pytest.fixture
def rl_args(tmp_path: Path, write_rl_files) -> list[str]:
    rows = tmp_path / "rows.jsonl"
    with GSM8K.open() as f:
        rows.write_text("".join(next(f) for _ in range(24)))
    loader, reward = write_rl_files(tmp_path, 40)
    return [
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(rows),
        "--dataset-loader-fn", str(loader), "--reward-fn-path", str(reward), "--batch-size", "4",
        "--n-samples", "4", "--mini-bs", "8",
        "--gradient-accumulation-steps", "1", "--max-new-tokens", "8", "--lr", "1e-3",
        "--no-activation-checkpointing",
    ]  # fmt: skip


def one_thread_run(*argv: str) -> None:
    """Run ``areno`` with one torch thread here (and one in the worker), so a synchronous and
    an asynchronous run compute with the same kernels."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_areno(*argv)
    finally:
        torch.set_num_threads(threads)


def test_max_staleness_zero_trains_exactly_like_synchronous_rollout(tmp_path, rl_args):
    one_thread_run(*rl_args, "--max-steps", "3", "--metrics-log-dir", str(tmp_path / "sync"))
    one_thread_run(
        *rl_args, "--max-steps", "3", "--metrics-log-dir", str(tmp_path / "async"),
        "--async-rollout", "--max-staleness", "0", "--rollout-threads", "1",
    )  # fmt: skip
    sync, asynchronous = history(tmp_path / "sync"), history(tmp_path / "async")
    assert [r["step"] for r in asynchronous] == [1, 2, 3]
    for a in asynchronous:
        assert a["rollout/staleness_max"] == 0.0 and a["rollout/stale_dropped"] == 0.0
        assert "train/stale_rows" not in a
    strip = [{k: v for k, v in r.items() if not _timing(k) and k not in ASYNC_ONLY} for r in sync]
    assert strip == [
        {k: v for k, v in r.items() if not _timing(k) and k not in ASYNC_ONLY} for r in asynchronous
    ]


def test_staleness_bound_holds_and_stale_steps_use_the_decoupled_objective(tmp_path, rl_args):
    run_areno(
        *rl_args, "--max-steps", "4", "--metrics-log-dir", str(tmp_path / "m"),
        "--async-rollout", "--max-staleness", "1",
    )  # fmt: skip
    steps = history(tmp_path / "m")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        # No sample older than K = 1 version is trained on, and none had to be dropped.
        assert r["rollout/staleness_max"] <= 1.0
        assert r["rollout/stale_dropped"] == 0.0
        assert r["rollout/policy_lag"] >= 0.0
        stale = r["rollout/staleness_max"] > 0
        assert ("train/behaviour_weight_mean" in r) == stale
        assert ("train/stale_rows" in r) == stale
    # The first batch is sampled by the initial policy; later ones run one version behind
    # while the trainer trains (the worker reads batch 2's rows before step 1's weights exist).
    assert steps[0]["rollout/staleness_max"] == 0.0
    assert any(r["rollout/staleness_max"] == 1.0 for r in steps[1:])
    for r in steps:
        if "train/stale_rows" in r:
            assert r["train/stale_rows"] == r["rollout/samples"]
            assert r["time/proximal"] > 0
            assert 0.0 < r["train/behaviour_weight_min"] <= r["train/behaviour_weight_max"]


@pytest.mark.slow
def test_interpolated_proximal_logprobs_train_and_report_behaviour_weights(tmp_path, rl_args):
    run_areno(
        *rl_args, "--max-steps", "3", "--metrics-log-dir", str(tmp_path / "m"),
        "--async-rollout", "--proximal-logprobs", "interpolate",
    )  # fmt: skip
    steps = history(tmp_path / "m")
    stale = [r for r in steps if r["rollout/staleness_max"] > 0]
    assert stale, "no step trained on samples of an older policy"
    for r in stale:
        assert "time/proximal" not in r  # no extra forward pass
        assert r["train/behaviour_weight_mean"] > 0
        assert torch.isfinite(torch.tensor(r["train/loss"]))


@pytest.mark.slow
def test_agentic_rollout_runs_in_the_worker(tmp_path):
    run_areno(
        "train", "--recipe", "agentic/tictactoe-cpu", "--algo", "grpo", "--max-steps", "2",
        "--async-rollout", "--metrics-log-dir", str(tmp_path / "m"),
    )  # fmt: skip
    steps = history(tmp_path / "m")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["rollout/agent_requests"] >= r["rollout/samples"] > 0
        assert r["rollout/agent_errors"] == 0
        assert r["rollout/staleness_max"] <= 1.0


@pytest.mark.slow
def test_agentic_batches_in_flight_together_train_as_one_at_a_time(tmp_path, rl_args):
    # A deterministic agent (a seed per sample); K = 1 lets batches 1 and 2 both leave with
    # the first policy, so with a bound of 2 the worker rolls them out at once.
    agent = REPO / "tests" / "fixtures" / "seeded_agent.py"
    common = [*rl_args, "--max-steps", "3", "--async-rollout", "--max-staleness", "1",
              "--rollout-threads", "1", "--agent-fn", str(agent)]  # fmt: skip
    one_thread_run(*common, "--max-inflight-batches", "1", "--metrics-log-dir", str(tmp_path / "a"))
    one_thread_run(*common, "--max-inflight-batches", "2", "--metrics-log-dir", str(tmp_path / "b"))
    alone, together = history(tmp_path / "a"), history(tmp_path / "b")
    assert [r["rollout/inflight_batches"] for r in together][:2] == [1.0, 2.0]
    assert all("rollout/inflight_batches" not in r for r in alone)
    # Timing, buffering and the agent's event-loop stalls aside, every step trained alike.
    skip = ASYNC_ONLY | {"rollout/inflight_batches", "rollout/agent_blocked_s"}
    for a, b in zip(alone, together, strict=True):
        assert a["rollout/samples"] == 16.0
        assert {k: v for k, v in a.items() if not _timing(k) and k not in skip} == {
            k: v for k, v in b.items() if not _timing(k) and k not in skip
        }


@pytest.mark.slow
def test_async_run_resumes_where_it_stopped(tmp_path, rl_args):
    run = tmp_path / "run"
    common = [*rl_args, "--async-rollout", "--save-path", str(run), "--save-interval", "2"]
    run_areno(*common, "--max-steps", "2")
    run_areno(*common, "--max-steps", "4", "--resume", "auto")
    steps = history(run / "tensorboard")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert (run / "step_4" / "model.safetensors").is_file()


@pytest.mark.slow
def test_worker_that_cannot_start_ends_the_run_with_its_error(tmp_path, rl_args, capsys):
    from areno_core.cli.main import main

    # The reward file loads in the trainer but fails in the spawned worker.
    reward = tmp_path / "reward.py"
    reward.write_text(
        "import multiprocessing\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    raise RuntimeError('no reward in the worker')\n" + reward.read_text()
    )
    with pytest.raises(SystemExit) as info:
        main([*rl_args, "--async-rollout", "--max-steps", "1", "--metrics-log-dir", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "the rollout worker stopped while starting" in err
    assert "no reward in the worker" in err


def _worker_pid(parent: int) -> int | None:
    """The spawned rollout worker among ``parent``'s children (not the resource tracker)."""
    children = Path(f"/proc/{parent}/task/{parent}/children")
    if not children.exists():
        return None
    for pid in children.read_text().split():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline:
            return int(pid)
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_rollout_worker_ends_the_run_with_a_clear_error(tmp_path, rl_args):
    metrics = tmp_path / "m"
    command = [sys.executable, "-m", "areno_core.cli.main", *rl_args, "--epochs", "1000",
               "--async-rollout", "--metrics-log-dir", str(metrics)]  # fmt: skip
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 240
        worker = None
        while time.monotonic() < deadline and proc.poll() is None:
            if (metrics / "metrics.jsonl").is_file() and (metrics / "metrics.jsonl").read_text():
                worker = _worker_pid(proc.pid)
                if worker is not None:
                    break
            time.sleep(0.2)
        assert worker is not None, "the run never reached a trained step with a live worker"
        os.kill(worker, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)  # no hang: the run ends by itself
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode()
    assert proc.returncode != 0
    assert "the rollout worker" in text and "was killed by a signal" in text, text[-2000:]


def _fill_args(rl_args: list[str]) -> list[str]:
    # One sample in 16 (the first of prompts 0, 4, 8...: one per batch) waits 2 s in a pretend
    # tool call, so each batch has a straggler that its step need not wait for.
    agent = REPO / "tests" / "fixtures" / "seeded_agent.py"
    return [*rl_args, "--async-rollout", "--max-staleness", "2", "--max-inflight-batches",
            "2", "--rollout-threads", "1", "--agent-fn", str(agent),
            "--step-fill", "completion"]  # fmt: skip


@pytest.mark.slow
def test_completion_fill_trains_steps_without_waiting_for_the_straggler(
    tmp_path, rl_args, monkeypatch, capsys
):
    monkeypatch.setenv("SEEDED_AGENT_SLOW_EVERY", "16")
    monkeypatch.setenv("SEEDED_AGENT_SLOW_S", "2")
    run = tmp_path / "run"
    common = [*_fill_args(rl_args), "--save-path", str(run), "--save-interval", "1"]
    one_thread_run(*common, "--max-steps", "3")
    first = history(run / "tensorboard")
    assert [r["step"] for r in first] == [1, 2, 3]
    # Step 1 took groups of step 2's rows while prompt 0 was still in its tool call.
    early = first[0]["rollout/groups_early"]
    assert early >= 1.0
    # ...groups that came on their own: their batches were still out, held by the straggler.
    assert first[0]["rollout/groups_streamed"] == 4.0
    for r in first:
        assert r["rollout/samples"] == 16.0  # 4 groups of 4, whichever rows they came from
        assert r["rollout/staleness_max"] <= 2.0 and r["rollout/stale_dropped"] == 0.0
    saved = torch.load(run / "step_1" / "trainer_state.pt", weights_only=True)
    fill = saved["trainer_state"]["rollout"]["fill"]
    owed = sorted(i for _, indices, _ in fill["owed"] for i in indices)
    ahead = sorted(i for _, indices in fill["ahead"] for i in indices)
    # Step 1 trained 4 groups: the rows of step 1 (prompts 0-3) it did not train are owed,
    # and the rows of step 2 (prompts 4-7) it trained are recorded as trained ahead.
    assert len(owed) == len(ahead) == early
    assert 0 in owed and set(owed) <= {0, 1, 2, 3} and set(ahead) <= {4, 5, 6, 7}

    # Resume from step 1. The fill is one of the options a resume keeps (the owed rows would
    # be lost without it): changing it is refused before anything is loaded.
    for later in ("step_2", "step_3"):
        shutil.rmtree(run / later)
    resume = ["train", "--save-path", str(run), "--resume", "auto", "--max-steps", "3"]
    assert areno_exit_code(*resume, "--step-fill", "batch") == 2
    assert "changes --step-fill 'completion' -> 'batch'" in capsys.readouterr().err
    assert not (run / "step_2").exists()
    one_thread_run(*resume)  # every other option as the saved run had it
    steps = history(run / "tensorboard")
    assert [r["step"] for r in steps] == [1, 2, 3]
    # The owed rows went out first, and were trained by the resumed steps.
    assert sum(r["rollout/groups_late"] for r in steps[1:]) >= len(owed)
    assert all(r["rollout/samples"] == 16.0 for r in steps)

"""Distributed training equals one process: 2 processes (dp=2, or tp=2) vs LocalBackend.

Both tests read one torchrun job of ``equality_worker.py`` (2 processes, gloo on the CPU),
which trains the same tiny model on the same global batch with both backends and reports the
largest weight difference per algorithm.
"""

from __future__ import annotations

import pytest

from .equality import assert_trained_like_one_process, run_equality_worker

ALGOS = ("sft", "dpo", "grpo", "ppo", "ppo_no_kl")

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    """One torchrun job: dp=2 for three steps, then tp=2 for one step (and a forward pass).

    A small learning rate keeps Adam's first steps (which divide each gradient by its own
    size) from magnifying rounding in gradients close to zero, while one step still moves
    each weight by up to 1e-4, ten times the tolerance.
    """
    out = tmp_path_factory.mktemp("equality") / "result.json"
    return run_equality_worker(out, 2, "--layouts", "1:3,2:1", "--lr", "1e-4")


@pytest.mark.timeout(600)
def test_data_parallel_two_processes_equal_one_process_after_three_steps(result):
    for algo in ALGOS:
        assert_trained_like_one_process(algo, result["tp1"][algo], steps=3)


@pytest.mark.timeout(600)
def test_tensor_parallel_forward_and_one_step_equal_one_process(result):
    assert result["tp2"]["forward"] < 1e-5
    for algo in ALGOS:
        entry = result["tp2"][algo]
        assert entry["policy"] < 1e-5, (algo, entry)
        assert entry.get("critic", 0.0) < 1e-5, (algo, entry)
        assert entry["losses"][0] == pytest.approx(entry["local_losses"][0], abs=1e-5)
        assert entry["moved"] > 5e-5, (algo, entry)

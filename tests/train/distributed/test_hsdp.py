"""Hybrid sharding (HSDP) equals one process: 4 processes as 2 "nodes" of 2 (``--dp-replicate
2``: parameters sharded within a node, one copy per node) against ``LocalBackend``.

One torchrun job of ``equality_worker.py`` (4 processes, gloo on the CPU) trains the same tiny
model on the same global batch both ways and reports the largest weight difference.
"""

from __future__ import annotations

import pytest

from .equality import assert_trained_like_one_process, run_equality_worker

CASES = ("sft", "grpo", "ppo")

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(600)
def test_hybrid_sharding_two_nodes_of_two_equal_one_process_after_two_steps(tmp_path):
    args = ("--replicate", "2", "--layouts", "1:2", "--cases", ",".join(CASES), "--lr", "1e-4")
    result = run_equality_worker(tmp_path / "result.json", 4, *args)["tp1"]
    for algo in CASES:
        entry = result[algo]
        # Replicated across the 2 groups, sharded in halves within each.
        assert entry["sharding"]["placements"] == ["R", "S(0)"], entry["sharding"]
        assert entry["sharding"]["local_numel"] * 2 == entry["sharding"]["numel"]
        assert_trained_like_one_process(algo, entry, steps=2)

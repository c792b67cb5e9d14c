"""Hybrid sharding (HSDP) equals one process: 4 processes as 2 "nodes" of 2 (``--dp-replicate
2``: parameters sharded within a node, one copy per node) against ``LocalBackend``.

One torchrun job of ``equality_worker.py`` (4 processes, gloo on the CPU) trains the same tiny
model on the same global batch both ways and reports the largest weight difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("equality_worker.py")
CASES = ("sft", "grpo", "ppo")

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(600)
def test_hybrid_sharding_two_nodes_of_two_equal_one_process_after_two_steps(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "4", str(WORKER), "--world-size", "4", "--replicate", "2",
            "--layouts", "1:2", "--cases", ",".join(CASES), "--lr", "1e-4", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=560,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(out.read_text())["tp1"]
    for algo in CASES:
        entry = result[algo]
        # Replicated across the 2 groups, sharded in halves within each.
        assert entry["sharding"]["placements"] == ["R", "S(0)"], entry["sharding"]
        assert entry["sharding"]["local_numel"] * 2 == entry["sharding"]["numel"]
        assert entry["policy"] < 1e-5, (algo, entry)
        assert entry.get("critic", 0.0) < 1e-5, (algo, entry)
        assert entry["optimizer_steps"][0] == entry["optimizer_steps"][1] >= 2
        for got, want in zip(entry["losses"], entry["local_losses"], strict=True):
            assert got == pytest.approx(want, abs=1e-5), (algo, entry)
        assert entry["moved"] > 1e-4, (algo, entry)  # so that equality means something

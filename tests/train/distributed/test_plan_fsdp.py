"""``areno plan --world-size 2`` against what FSDP2 holds on each of 2 processes (CPU, gloo):
parameter, gradient and AdamW shards to the byte, and the peak of one forward and backward
pass (activations, gradient shards, gathered layers) within PEAK_TOLERANCE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areno_core.plan.estimate import Setup, estimate
from areno_core.plan.shapes import resolve_shape

WORKER = Path(__file__).with_name("plan_worker.py")
# Measured: the prediction was 7% over the peak (docs/plan.md).
PEAK_TOLERANCE = 0.15

# Slow: a measurement of the planner, not a behaviour of the trainer; CI stays under its time
# budget without it (run it with: pytest -m "distributed and slow" tests/train/distributed).
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.timeout(400)
def test_fsdp2_shards_and_peak_per_process_match_the_plan(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(WORKER), "--out", str(out)],
        capture_output=True, text=True, timeout=360,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    measured = json.loads(out.read_text())
    setup = Setup(
        shape=resolve_shape("random:qwen3-small"), seq_len=measured["tokens"],
        micro_batch=measured["rows"], dtype="float32", device="cpu", world_size=2,
    )  # fmt: skip
    plan = estimate(setup)
    items = {i.name: i.bytes for i in plan.items}
    assert items["weights"] == measured["weights"]
    assert items["gradients"] == measured["gradients"]
    assert items["optimizer state"] == measured["optimizer"]
    predicted = plan.activation(False) + items["gradients"] + items["FSDP2 gathered layers"]
    assert predicted == pytest.approx(measured["peak"], rel=PEAK_TOLERANCE)

"""Runs ``equality_worker.py`` and checks its report, for the equality tests (not a test file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("equality_worker.py")


def run_equality_worker(out: Path, world_size: int, *args: str) -> dict[str, Any]:
    """One torchrun job of the worker (``world_size`` processes, gloo on the CPU, one torch
    thread each) with the worker options ``args``; returns the report it wrote to ``out``."""
    proc = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(world_size), str(WORKER), "--world-size", str(world_size),
            *args, "--out", str(out),
        ],
        capture_output=True, text=True, timeout=560,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text())


def assert_trained_like_one_process(algo: str, entry: dict[str, Any], *, steps: int) -> None:
    """``entry`` (one algorithm of a ``tp1`` layout) ended within 1e-5 of the one-process run
    after at least ``steps`` optimizer steps on every rank, with the same losses, and the
    weights moved more than that tolerance."""
    assert entry["policy"] < 1e-5, (algo, entry)
    assert entry.get("critic", 0.0) < 1e-5, (algo, entry)
    assert entry["optimizer_steps"][0] == entry["optimizer_steps"][1] >= steps
    for got, want in zip(entry["losses"], entry["local_losses"], strict=True):
        assert got == pytest.approx(want, abs=1e-5), (algo, entry)
    assert entry["moved"] > 1e-4, (algo, entry)  # so that equality means something

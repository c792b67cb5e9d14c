"""Exporting a checkpoint as a shippable warm start (areno_core.models.warmstart)."""

from __future__ import annotations

import hashlib
import json

import pytest

from areno_core.models.warmstart import PROVENANCE_FILE, export_checkpoint


def _checkpoint(root, step: str) -> None:
    step_dir = root / step
    step_dir.mkdir(parents=True)
    (step_dir / "model.safetensors").write_bytes(b"weights of " + step.encode())
    (step_dir / "config.json").write_text("{}")
    (step_dir / "optimizer.pt").write_bytes(b"trainer state")
    (step_dir / "config.yaml").write_text("save_path: /abs/path\n")


def test_export_takes_the_latest_step_keeps_model_files_and_records_provenance(tmp_path):
    run = tmp_path / "run"
    _checkpoint(run, "step_10")
    _checkpoint(run, "step_20")
    (run / "latest").write_text("step_20\n")
    out = tmp_path / "warm"
    out.mkdir()
    (out / "stale.bin").write_bytes(b"old")  # the destination is replaced, not merged

    assert export_checkpoint(run, out, command="areno train --recipe x") == out

    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        PROVENANCE_FILE,
    ]
    assert (out / "model.safetensors").read_bytes() == b"weights of step_20"
    assert json.loads((out / PROVENANCE_FILE).read_text()) == {
        "source_step": "step_20",
        "command": "areno train --recipe x",
        "model_sha256": hashlib.sha256(b"weights of step_20").hexdigest(),
    }


def test_export_of_a_directory_without_weights_fails_and_writes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no model.safetensors"):
        export_checkpoint(tmp_path / "empty", tmp_path / "warm", command="c")
    assert not (tmp_path / "warm").exists()

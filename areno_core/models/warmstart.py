"""Export a training checkpoint as a warm start a recipe pack can ship.

A checkpoint also holds optimizer state, RNG state and the run's config (with absolute paths);
the export keeps only the Hugging Face files a run starts from (weights, config, tokenizer and
its chat template) and writes ``provenance.json``: the source step, the command that made the
checkpoint, and the SHA-256 of the weights. Recipe packs wrap :func:`export_checkpoint` in a
``python -m`` command of their own, built with :func:`export_command` (see
``areno_recipes_math.warmstart``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

# Hugging Face files of a model directory; everything else in a checkpoint is trainer state.
KEEP_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
PROVENANCE_FILE = "provenance.json"


def sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_step_dir(src: str | Path) -> Path:
    """A checkpoint directory; a save root with a ``latest`` file means its newest step."""
    src = Path(src)
    latest = src / "latest"
    return src / latest.read_text().strip() if latest.is_file() else src


def export_checkpoint(src: str | Path, out: str | Path, *, command: str) -> Path:
    """Copy the model and tokenizer files of checkpoint ``src`` (or of the newest checkpoint
    of a run directory) into ``out``, which is replaced; ``command`` is recorded as how the
    checkpoint was made."""
    step_dir = resolve_step_dir(src)
    if not (step_dir / "model.safetensors").is_file():
        raise FileNotFoundError(f"{step_dir} holds no model.safetensors; is it a checkpoint?")
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in KEEP_FILES:
        if (step_dir / name).is_file():
            shutil.copyfile(step_dir / name, out / name)
    provenance = {
        "source_step": step_dir.name,
        "command": command,
        "model_sha256": sha256(out / "model.safetensors"),
    }
    (out / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
    return out


def export_command(
    argv: Sequence[str] | None, *, prog: str, description: str, command: str
) -> Path:
    """A pack's ``python -m ... SRC --out DIR`` command: parse ``argv`` and export checkpoint
    ``SRC`` into ``DIR`` (replaced), recording ``command``; returns the export's directory."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("src", help="checkpoint directory or the run's --save-path")
    parser.add_argument("--out", required=True, help="destination directory (replaced)")
    args = parser.parse_args(argv)
    return export_checkpoint(args.src, args.out, command=command)


__all__ = [
    "KEEP_FILES",
    "PROVENANCE_FILE",
    "export_checkpoint",
    "export_command",
    "resolve_step_dir",
    "sha256",
]

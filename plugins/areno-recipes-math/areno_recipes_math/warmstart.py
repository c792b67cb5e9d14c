"""Export an SFT checkpoint as the shipped ``math/arith`` warm start (model + tokenizer only).

    areno train --recipe math/arith-sft --save-path runs/arith-sft
    python -m areno_recipes_math.warmstart runs/arith-sft \\
        --out plugins/areno-recipes-math/areno_recipes_math/checkpoints/arith-sft

A training checkpoint also holds optimizer state, RNG state and the run config (with absolute
paths); the export keeps only the Hugging Face files a run needs to start from, plus
``provenance.json`` (the source step, the command and a SHA-256 of the weights).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
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
SFT_COMMAND = "areno train --recipe math/arith-sft --save-path runs/arith-sft"


def sha256(path: Path) -> str:
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


def export_checkpoint(src: str | Path, out: str | Path, *, command: str = SFT_COMMAND) -> Path:
    """Copy the model and tokenizer files of ``src`` into ``out`` (replaced if it exists)."""
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_math.warmstart",
        description="Export an SFT checkpoint's model and tokenizer files.",
    )
    parser.add_argument("src", help="checkpoint directory or the run's --save-path")
    parser.add_argument("--out", required=True, help="destination directory (replaced)")
    args = parser.parse_args(argv)
    export_checkpoint(args.src, args.out)


if __name__ == "__main__":
    main()

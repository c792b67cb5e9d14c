"""Export an SFT checkpoint as the shipped ``agentic/tictactoe-cpu`` warm start.

    areno train --recipe agentic/tictactoe-cpu-sft --save-path runs/ttt-sft
    python -m areno_recipes_agentic.tictactoe.warmstart runs/ttt-sft \\
        --out plugins/areno-recipes-agentic/areno_recipes_agentic/checkpoints/tictactoe-sft

A training checkpoint also holds optimizer and RNG state and the run's config; the export
keeps the Hugging Face files a run starts from (weights, config, tokenizer with its chat
template) and writes ``provenance.json``: the source step, the command, and the SHA-256 of
the weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

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
SFT_COMMAND = "areno train --recipe agentic/tictactoe-cpu-sft --save-path runs/ttt-sft"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_checkpoint(src: str | Path, out: str | Path, *, command: str = SFT_COMMAND) -> Path:
    """Copy the model and tokenizer files of checkpoint ``src`` (or of the newest checkpoint
    of a run directory) into ``out``, which is replaced."""
    step_dir = Path(src)
    if (step_dir / "latest").is_file():
        step_dir = step_dir / (step_dir / "latest").read_text().strip()
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_agentic.tictactoe.warmstart",
        description="Export an SFT checkpoint's model and tokenizer files as a warm start.",
    )
    parser.add_argument("src", help="checkpoint directory or the run's --save-path")
    parser.add_argument("--out", required=True, help="destination directory (replaced)")
    args = parser.parse_args(argv)
    print(export_checkpoint(args.src, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
from collections.abc import Sequence
from pathlib import Path

from areno_core.models.warmstart import KEEP_FILES, PROVENANCE_FILE, sha256
from areno_core.models.warmstart import export_checkpoint as _export

SFT_COMMAND = "areno train --recipe agentic/tictactoe-cpu-sft --save-path runs/ttt-sft"


def export_checkpoint(src: str | Path, out: str | Path, *, command: str = SFT_COMMAND) -> Path:
    """Export checkpoint ``src`` as this pack's warm start in ``out`` (replaced), recording
    ``command`` (see :func:`areno_core.models.warmstart.export_checkpoint`)."""
    return _export(src, out, command=command)


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


__all__ = ["KEEP_FILES", "PROVENANCE_FILE", "SFT_COMMAND", "export_checkpoint", "main", "sha256"]


if __name__ == "__main__":
    raise SystemExit(main())

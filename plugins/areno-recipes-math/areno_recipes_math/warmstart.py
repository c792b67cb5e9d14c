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
from pathlib import Path

from areno_core.models.warmstart import KEEP_FILES, PROVENANCE_FILE, sha256
from areno_core.models.warmstart import export_checkpoint as _export

SFT_COMMAND = "areno train --recipe math/arith-sft --save-path runs/arith-sft"


def export_checkpoint(src: str | Path, out: str | Path, *, command: str = SFT_COMMAND) -> Path:
    """Export checkpoint ``src`` as this pack's warm start in ``out`` (replaced), recording
    ``command`` (see :func:`areno_core.models.warmstart.export_checkpoint`)."""
    return _export(src, out, command=command)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_math.warmstart",
        description="Export an SFT checkpoint's model and tokenizer files.",
    )
    parser.add_argument("src", help="checkpoint directory or the run's --save-path")
    parser.add_argument("--out", required=True, help="destination directory (replaced)")
    args = parser.parse_args(argv)
    export_checkpoint(args.src, args.out)


__all__ = ["KEEP_FILES", "PROVENANCE_FILE", "SFT_COMMAND", "export_checkpoint", "main", "sha256"]


if __name__ == "__main__":
    main()

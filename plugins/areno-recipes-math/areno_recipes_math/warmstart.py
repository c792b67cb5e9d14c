"""Export an SFT checkpoint as the shipped ``math/arith`` warm start (model + tokenizer only).

    areno train --recipe math/arith-sft --save-path runs/arith-sft
    python -m areno_recipes_math.warmstart runs/arith-sft \\
        --out plugins/areno-recipes-math/areno_recipes_math/checkpoints/arith-sft

A training checkpoint also holds optimizer state, RNG state and the run config (with absolute
paths); the export keeps only the Hugging Face files a run needs to start from, plus
``provenance.json`` (the source step, the command and a SHA-256 of the weights).
"""

from __future__ import annotations

from functools import partial

from areno_core.models.warmstart import KEEP_FILES, PROVENANCE_FILE, export_command, sha256
from areno_core.models.warmstart import export_checkpoint as _export

SFT_COMMAND = "areno train --recipe math/arith-sft --save-path runs/arith-sft"

# Export checkpoint ``src`` as this pack's warm start in ``out`` (replaced), recording
# SFT_COMMAND (see :func:`areno_core.models.warmstart.export_checkpoint`).
export_checkpoint = partial(_export, command=SFT_COMMAND)


def main(argv: list[str] | None = None) -> None:
    export_command(
        argv,
        prog="python -m areno_recipes_math.warmstart",
        description="Export an SFT checkpoint's model and tokenizer files.",
        command=SFT_COMMAND,
    )


__all__ = ["KEEP_FILES", "PROVENANCE_FILE", "SFT_COMMAND", "export_checkpoint", "main", "sha256"]


if __name__ == "__main__":
    main()

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

from collections.abc import Sequence
from functools import partial

from areno_core.models.warmstart import KEEP_FILES, PROVENANCE_FILE, export_command, sha256
from areno_core.models.warmstart import export_checkpoint as _export

SFT_COMMAND = "areno train --recipe agentic/tictactoe-cpu-sft --save-path runs/ttt-sft"

# Export checkpoint ``src`` as this pack's warm start in ``out`` (replaced), recording
# SFT_COMMAND (see :func:`areno_core.models.warmstart.export_checkpoint`).
export_checkpoint = partial(_export, command=SFT_COMMAND)


def main(argv: Sequence[str] | None = None) -> int:
    out = export_command(
        argv,
        prog="python -m areno_recipes_agentic.tictactoe.warmstart",
        description="Export an SFT checkpoint's model and tokenizer files as a warm start.",
        command=SFT_COMMAND,
    )
    print(out)
    return 0


__all__ = ["KEEP_FILES", "PROVENANCE_FILE", "SFT_COMMAND", "export_checkpoint", "main", "sha256"]


if __name__ == "__main__":
    raise SystemExit(main())

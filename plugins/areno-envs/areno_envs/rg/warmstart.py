"""Export an SFT checkpoint as a shipped ``rg-cpu`` warm start (model + tokenizer).

    areno train --recipe rg-cpu/chain_sum-sft --algo sft --save-path runs/chain-sum-sft
    python -m areno_envs.rg.warmstart runs/chain-sum-sft \\
        --out plugins/areno-envs/areno_envs/checkpoints/chain-sum-sft

``--command`` records another SFT command as the provenance (``rg-cpu/basic_arithmetic``'s
warm start: see ``scripts/make_basic_arithmetic_warmstart.sh``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from areno_core.models.warmstart import export_checkpoint as _export

SFT_COMMAND = "areno train --recipe rg-cpu/chain_sum-sft --algo sft --save-path runs/chain-sum-sft"


def export_checkpoint(src: str | Path, out: str | Path, *, command: str = SFT_COMMAND) -> Path:
    """Export checkpoint ``src`` (a step directory or a run's save path) into ``out``."""
    return _export(src, out, command=command)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m areno_envs.rg.warmstart",
        description="Export an SFT checkpoint's model and tokenizer files.",
    )
    parser.add_argument("src", help="checkpoint directory or the run's --save-path")
    parser.add_argument("--out", required=True, help="destination directory (replaced)")
    parser.add_argument(
        "--command", default=SFT_COMMAND, help="the SFT command to record as the provenance"
    )
    args = parser.parse_args(argv)
    export_checkpoint(args.src, args.out, command=args.command)


if __name__ == "__main__":
    main()

"""What the game data generators share: their common command-line options and the JSONL writer."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def generator_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the options every generator takes: ``--output``, ``--count``, ``--seed``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--output", required=True, help="JSONL file to write")
    parser.add_argument("--count", type=int, default=256, help="number of rows (default 256)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return parser


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """``rows`` as JSON lines at ``path``, its folder created when missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")

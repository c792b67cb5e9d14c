"""Write random DuelGrid starting states as JSONL.

    python examples/agentic/duelgrid/dataset_generator.py \
        --count 256 --output /tmp/areno-duelgrid.jsonl

Each row is ``{"id": ..., "mode": "tool", "state": {...}}``: a map with walls, traps, health and
energy pickups, the user's unit ``U`` and the model's unit ``A`` (to move, turn energy granted).

Options: ``--output`` (required), ``--count`` (default 256), ``--seed`` (default 0),
``--size`` (map side, default 7), ``--mode tool|text`` and ``--turns`` (rounds the agent plays
per row; default 2). The agentic pack's generator does the work
(``python -m areno_recipes_agentic.duelgrid.generate`` is the same command).
"""

from areno_recipes_agentic.duelgrid.generate import main

if __name__ == "__main__":
    raise SystemExit(main())

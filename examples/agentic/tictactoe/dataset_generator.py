"""Write tic-tac-toe training positions as JSONL.

    python examples/agentic/tictactoe/dataset_generator.py \
        --output /tmp/areno-tictactoe.jsonl --count 256 --seed 2026

Each row is a reachable position, game not over, with the side to move and its solved answer
(legal and optimal squares, minimax value), for example::

    {"id": "tictactoe-2026-00000", "board": "X.O.X....", "player": "O", "mode": "tool",
     "legal_moves": [2, 4, 6, 7, 8, 9], "optimal_moves": [9], "value": 0}

Options: ``--output`` (required), ``--count`` (default 256), ``--seed`` (default 0), ``--mode
tool|text`` and ``--include-trivial``. The agentic pack's generator does the work
(``python -m areno_recipes_agentic.tictactoe.generate`` is the same command).
"""

from areno_recipes_agentic.tictactoe.generate import main

if __name__ == "__main__":
    raise SystemExit(main())

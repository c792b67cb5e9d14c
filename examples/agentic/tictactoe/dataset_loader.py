"""Tic-tac-toe positions as chat prompts for the tic-tac-toe agent.

    areno train ... --dataset-loader-fn examples/agentic/tictactoe/dataset_loader.py

Row contract
    in:  ``board`` (9 characters of ``X``, ``O`` and ``.``, row by row), optionally ``mode``
         (``"tool"``, the default, or ``"text"``) and the solved fields the generator writes;
    out: the same row plus ``prompt`` (system rules + the position), ``player``,
         ``legal_moves``, ``optimal_moves``, ``value``, ``solutions`` and, in tool mode,
         ``tools`` (the ``choose_square`` schema). A finished or malformed board is an error.

The work is done by ``areno_recipes_agentic.tictactoe.loader.tictactoe_loader`` (the agentic
pack's ``tictactoe`` loader).
"""

from areno_recipes_agentic.tictactoe.loader import tictactoe_loader


def load_row(row):
    """The default function ``--dataset-loader-fn`` calls for each raw row."""
    return tictactoe_loader(row)

"""Tic-tac-toe reward: the model's move graded against a perfect (minimax) player.

    areno train ... --reward-fn-path examples/agentic/tictactoe/reward.py

It reads the square from the first ``choose_square`` tool call (or from ``<move>N</move>`` for
rows in text mode) and the position from ``record.row``. Scores: 1.0 an optimal move, 0.6 a
slower way to the same result, 0.3 a won game given away to a draw, 0.1 an avoidable loss,
0.0 an illegal, missing or unreadable move. With retries (multi-turn), the first legal move
counts, halved per failed attempt. It never raises.

The work is done by ``areno_recipes_agentic.tictactoe.reward.tictactoe_reward_fn`` (the
agentic pack's ``tictactoe`` reward).
"""

from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn


def reward_fn(record):
    """The default function ``--reward-fn-path`` calls for each sample."""
    return tictactoe_reward_fn(record)

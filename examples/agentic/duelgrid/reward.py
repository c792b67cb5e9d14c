"""DuelGrid reward: replays the model's actions with the rule engine and scores the outcome.

    areno train ... --reward-fn-path examples/agentic/duelgrid/reward.py

It reads A's action list from each assistant turn (the ``choose_action`` tool call, or a
JSON ``{"actions": [...]}`` in the text at half weight), replays the rounds from
``record.row["state"]`` against the scripted opponent, and scores each turn in [0, 1] as a
weighted mix of damage dealt, closing in on U, pickups gained, energy spent usefully and trap
damage avoided (halved when an action was rejected, 0 when A dies); the turns are averaged.
It never raises: anything unreadable scores 0.0.

The work is done by ``areno_recipes_agentic.duelgrid.reward.duelgrid_reward_fn`` (the agentic
pack's ``duelgrid`` reward).
"""

from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn


def reward_fn(record):
    """The default function ``--reward-fn-path`` calls for each sample."""
    return duelgrid_reward_fn(record)

"""Entry point of the agentic pack: registers the game loaders and rewards."""

from __future__ import annotations

from areno_core import hookimpl
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader
from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn


@hookimpl
def register_dataset_loaders(register):  # type: ignore[no-untyped-def]
    register("tictactoe", tictactoe_loader)
    register("duelgrid", duelgrid_loader)


@hookimpl
def register_rewards(register):  # type: ignore[no-untyped-def]
    register("tictactoe", tictactoe_reward_fn)
    register("duelgrid", duelgrid_reward_fn)

"""Entry point of the agentic pack: registers the game loaders, rewards, agents and recipes."""

from __future__ import annotations

from areno_core import hookimpl
from areno_recipes_agentic.duelgrid.agent import run_agent as duelgrid_agent
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.recipes import RECIPES
from areno_recipes_agentic.tictactoe.agent import run_agent as tictactoe_agent
from areno_recipes_agentic.tictactoe.agent import run_agent_with_retry as tictactoe_retry_agent
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader, tictactoe_sft_loader
from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn


@hookimpl
def register_dataset_loaders(register):  # type: ignore[no-untyped-def]
    register("tictactoe", tictactoe_loader)
    register("tictactoe_sft", tictactoe_sft_loader)
    register("duelgrid", duelgrid_loader)


@hookimpl
def register_rewards(register):  # type: ignore[no-untyped-def]
    register("tictactoe", tictactoe_reward_fn)
    register("duelgrid", duelgrid_reward_fn)


@hookimpl
def register_agents(register):  # type: ignore[no-untyped-def]
    register("tictactoe", tictactoe_agent)
    register("tictactoe-retry", tictactoe_retry_agent)
    register("duelgrid", duelgrid_agent)


@hookimpl
def register_recipes(register):  # type: ignore[no-untyped-def]
    for recipe in RECIPES:
        register(recipe)

"""Entry point of the agentic pack: registers the game loaders, rewards, agents and recipes."""

from __future__ import annotations

from areno_core import Pack
from areno_recipes_agentic.duelgrid.agent import run_agent as duelgrid_agent
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.recipes import RECIPES
from areno_recipes_agentic.tictactoe.agent import run_agent as tictactoe_agent
from areno_recipes_agentic.tictactoe.agent import run_agent_with_retry as tictactoe_retry_agent
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader, tictactoe_sft_loader
from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn

PACK = Pack(
    dataset_loaders={
        "tictactoe": tictactoe_loader,
        "tictactoe_sft": tictactoe_sft_loader,
        "duelgrid": duelgrid_loader,
    },
    rewards={"tictactoe": tictactoe_reward_fn, "duelgrid": duelgrid_reward_fn},
    agents={
        "tictactoe": tictactoe_agent,
        "tictactoe-retry": tictactoe_retry_agent,
        "duelgrid": duelgrid_agent,
    },
    recipes=RECIPES,
)

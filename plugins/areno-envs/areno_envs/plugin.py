"""Entry point of the environments pack: registers what adapts each installed library.

Nothing here imports the libraries themselves: reasoning-gym's task names come from
:mod:`areno_envs.rg.tasks` (a shipped list for the tested version), and each library is
imported only when one of its loaders, rewards or agents runs.
"""

from __future__ import annotations

from areno_core import hookimpl
from areno_envs.rg.loader import rg_loader, rg_sft_loader, task_loader
from areno_envs.rg.recipes import CPU_RECIPES, task_recipe
from areno_envs.rg.reward import rg_reward_fn
from areno_envs.rg.tasks import task_names
from areno_envs.vf.agent import run_agent as vf_agent
from areno_envs.vf.loader import vf_loader
from areno_envs.vf.reward import vf_reward_fn


@hookimpl
def register_dataset_loaders(register):  # type: ignore[no-untyped-def]
    register("rg", rg_loader)
    register("rg_sft", rg_sft_loader)
    register("vf", vf_loader)
    for task in task_names():
        register(f"rg/{task}", task_loader(task))


@hookimpl
def register_rewards(register):  # type: ignore[no-untyped-def]
    register("rg", rg_reward_fn)
    register("vf", vf_reward_fn)


@hookimpl
def register_agents(register):  # type: ignore[no-untyped-def]
    register("vf", vf_agent)


@hookimpl
def register_recipes(register):  # type: ignore[no-untyped-def]
    for task in task_names():
        register(task_recipe(task))
    for recipe in CPU_RECIPES:
        register(recipe)

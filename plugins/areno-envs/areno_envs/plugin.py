"""Entry point of the environments pack: registers what adapts each installed library.

Nothing here imports the libraries themselves: reasoning-gym's task names come from
:mod:`areno_envs.rg.tasks` (a shipped list for the tested version), and each library is
imported only when one of its loaders, rewards or agents runs.
"""

from __future__ import annotations

from typing import Any

from areno_core import Pack
from areno_envs.rg.loader import rg_loader, rg_sft_loader, task_loader
from areno_envs.rg.recipes import CPU_RECIPES, task_recipe
from areno_envs.rg.reward import rg_reward_fn
from areno_envs.rg.tasks import task_names
from areno_envs.vf.agent import run_agent as vf_agent
from areno_envs.vf.loader import vf_loader
from areno_envs.vf.reward import vf_reward_fn


def _loaders() -> dict[str, Any]:
    tasks = {f"rg/{task}": task_loader(task) for task in task_names()}
    return {"rg": rg_loader, "rg_sft": rg_sft_loader, "vf": vf_loader, **tasks}


def _recipes() -> list[Any]:
    return [*(task_recipe(task) for task in task_names()), *CPU_RECIPES]


# The reasoning-gym tables are built when the plugin registers, from the installed task list.
PACK = Pack(
    dataset_loaders=_loaders,
    rewards={"rg": rg_reward_fn, "vf": vf_reward_fn},
    agents={"vf": vf_agent},
    recipes=_recipes,
)

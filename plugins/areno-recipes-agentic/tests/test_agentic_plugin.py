"""The agentic pack registers its loaders, rewards, agents and recipes through the areno hooks."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import pluggy
import pytest
from areno_recipes_agentic import plugin
from areno_recipes_agentic.duelgrid.agent import run_agent as duelgrid_agent
from areno_recipes_agentic.duelgrid.generate import generate_states
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.recipes import RECIPES
from areno_recipes_agentic.tictactoe.agent import run_agent as tictactoe_agent
from areno_recipes_agentic.tictactoe.agent import run_agent_with_retry
from areno_recipes_agentic.tictactoe.generate import generate_positions
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader, tictactoe_sft_loader
from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn

from areno_core import hookspecs
from areno_core.data import apply_loader
from areno_core.data.schema import AGENTIC_SCHEMA, RL_SCHEMA, validate_rows


def _collect(hook: str) -> dict[str, Any]:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(plugin.PACK, name="agentic")
    pm.check_pending()
    seen: dict[str, Any] = {}

    def register(*args: Any) -> None:
        if len(args) == 1:  # recipes
            seen[args[0].name] = args[0]
        else:
            seen[args[0]] = args[1]

    getattr(pm.hook, hook)(register=register)
    return seen


@pytest.mark.parametrize(
    ("hook", "expected"),
    [
        pytest.param(
            "register_dataset_loaders",
            {
                "tictactoe": tictactoe_loader,
                "tictactoe_sft": tictactoe_sft_loader,
                "duelgrid": duelgrid_loader,
            },
            id="dataset-loaders-of-both-games",
        ),
        pytest.param(
            "register_rewards",
            {"tictactoe": tictactoe_reward_fn, "duelgrid": duelgrid_reward_fn},
            id="rewards-of-both-games",
        ),
        pytest.param(
            "register_agents",
            {
                "tictactoe": tictactoe_agent,
                "tictactoe-retry": run_agent_with_retry,
                "duelgrid": duelgrid_agent,
            },
            id="agents-of-both-games-and-retry",
        ),
    ],
)
def test_plugin_registers_each_game_function_by_name(hook: str, expected: dict[str, Any]) -> None:
    assert _collect(hook) == expected


def test_plugin_register_recipes_gives_gpu_and_cpu_recipes() -> None:
    assert _collect("register_recipes") == {r.name: r for r in RECIPES}
    assert sorted(r.name for r in RECIPES) == [
        "agentic/duelgrid",
        "agentic/duelgrid-cpu",
        "agentic/tictactoe",
        "agentic/tictactoe-cpu",
        "agentic/tictactoe-cpu-sft",
        "agentic/tictactoe-cpu-smoke",
    ]


def test_plugin_entry_point_installed_points_at_the_pack() -> None:
    found = [ep for ep in entry_points(group="areno") if ep.name == "agentic"]
    assert len(found) == 1
    assert found[0].value == "areno_recipes_agentic.plugin:PACK"


def test_loaders_generated_rows_pass_core_rl_and_agentic_schemas() -> None:
    for rows, loader in (
        (generate_positions(20, seed=1), tictactoe_loader),
        (generate_positions(20, seed=1, mode="text"), tictactoe_loader),
        (generate_states(20, seed=1), duelgrid_loader),
    ):
        loaded = apply_loader(rows, loader)
        assert len(loaded) == 20
        validate_rows(loaded, RL_SCHEMA, algo="gspo")
        validate_rows(loaded, AGENTIC_SCHEMA, algo="gspo")

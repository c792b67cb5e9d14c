"""The agentic pack registers its loaders and rewards through the areno hooks."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import pluggy
from areno_recipes_agentic import plugin
from areno_recipes_agentic.duelgrid.generate import generate_states
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.tictactoe.generate import generate_positions
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader
from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn

from areno_core import hookspecs
from areno_core.data import apply_loader
from areno_core.data.schema import AGENTIC_SCHEMA, RL_SCHEMA, validate_rows


def _collect(hook: str) -> dict[str, Any]:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(plugin, name="agentic")
    pm.check_pending()
    seen: dict[str, Any] = {}
    getattr(pm.hook, hook)(register=lambda name, fn: seen.__setitem__(name, fn))
    return seen


def test_plugin_register_dataset_loaders_gives_both_games() -> None:
    assert _collect("register_dataset_loaders") == {
        "tictactoe": tictactoe_loader,
        "duelgrid": duelgrid_loader,
    }


def test_plugin_register_rewards_gives_both_games() -> None:
    assert _collect("register_rewards") == {
        "tictactoe": tictactoe_reward_fn,
        "duelgrid": duelgrid_reward_fn,
    }


def test_plugin_entry_point_installed_points_at_plugin_module() -> None:
    found = [ep for ep in entry_points(group="areno") if ep.name == "agentic"]
    assert len(found) == 1
    assert found[0].value == "areno_recipes_agentic.plugin"


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

"""Entry point of the internal smoke pack: its recipes and loaders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_core import hookimpl
from areno_smoke.loaders import preference_loader, prompt_loader, sft_loader
from areno_smoke.recipes import SMOKE_RECIPES


@hookimpl
def register_recipes(register: Callable[[Any], None]) -> None:
    for recipe in SMOKE_RECIPES:
        register(recipe)


@hookimpl
def register_dataset_loaders(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register("smoke_sft", sft_loader)
    register("smoke_preferences", preference_loader)
    register("smoke_prompts", prompt_loader)

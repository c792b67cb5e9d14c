"""Entry point of the internal smoke pack: its recipes and loaders."""

from __future__ import annotations

from areno_core import Pack
from areno_smoke.loaders import preference_loader, prompt_loader, sft_loader
from areno_smoke.recipes import SMOKE_RECIPES

PACK = Pack(
    dataset_loaders={
        "smoke_sft": sft_loader,
        "smoke_preferences": preference_loader,
        "smoke_prompts": prompt_loader,
    },
    recipes=SMOKE_RECIPES,
)

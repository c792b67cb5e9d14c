"""Recipe views for ``areno train``: the ``--list-recipes`` table and the ``--dry-run`` header.

Recipes are an input to ``areno train``, so discovering them lives on ``train`` rather than in
a command of its own (see docs/product/recipe-system.md, "Listing and inspecting")::

    areno train --list-recipes                       # public recipes
    areno train --list-recipes --algo dpo            # ... that support dpo
    areno train --list-recipes --include-internal    # maintainers: smoke/release recipes too
    areno train --recipe math/gsm8k --algo grpo --dry-run   # what the recipe will set
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from areno_core.recipe import Recipe
from areno_core.registry import Registry
from areno_core.resolve import ResolvedRun


def listed_recipes(
    registry: Registry, *, include_internal: bool = False, algo: str | None = None
) -> list[Recipe]:
    """Recipes to list: public ones (internal ones too when asked), optionally for one algo."""
    found = registry.recipes(include_internal=include_internal)
    if algo:
        found = [r for r in found if algo in r.algorithms]
    return found


def print_recipe_table(
    console: Console,
    registry: Registry,
    *,
    include_internal: bool = False,
    algo: str | None = None,
) -> None:
    recipes = listed_recipes(registry, include_internal=include_internal, algo=algo)
    if not recipes:
        what = f" supporting --algo {algo}" if algo else ""
        console.print(
            f"No recipes{what} are installed. Install a recipe pack, e.g.: "
            "pip install areno-recipes-math",
            highlight=False,
        )
        return
    title = "areno recipes" + (f" for --algo {algo}" if algo else "")
    table = Table(title=title)
    table.add_column("recipe", no_wrap=True)
    table.add_column("algorithms")
    table.add_column("hardware floor", no_wrap=True)
    table.add_column("LoRA", no_wrap=True)
    table.add_column("summary")
    for recipe in recipes:
        row = [
            f"{recipe.name} (internal)" if recipe.internal else recipe.name,
            ", ".join(recipe.algorithms),
            recipe.hardware.describe(),
            "required" if recipe.lora_required else "-",
            recipe.summary,
        ]
        table.add_row(*row)
    console.print(table)
    console.print(
        "See what a recipe sets: areno train --recipe NAME --algo ALGO --dry-run",
        highlight=False,
    )


def dry_run_header(resolved: ResolvedRun) -> str:
    """YAML comment lines describing the recipe behind a resolved run (empty without one)."""
    recipe = resolved.recipe
    if recipe is None:
        return ""
    cfg = resolved.config
    lines = [
        f"recipe {recipe.name} ({recipe.visibility}) with --algo {cfg.algo}: {recipe.summary}",
        f"hardware floor: {recipe.hardware.describe()}"
        + (f" ({recipe.hardware.note})" if recipe.hardware.note else "")
        + f"; LoRA: {'required' if recipe.lora_required else 'not required'}",
    ]
    if recipe.lora_defaults:
        lines.append(
            "with --lora-rank the recipe also sets: "
            + ", ".join(f"{k}={v!r}" for k, v in recipe.lora_defaults.items())
            + (" (applied)" if cfg.lora_rank is not None else "")
        )
    set_by_recipe, overridden = _recipe_sets(resolved.recipe_options, resolved.explicit)
    if set_by_recipe:
        lines.append("set by the recipe: " + ", ".join(set_by_recipe))
    if overridden:
        lines.append("recipe values overridden by --config/flags: " + ", ".join(overridden))
    for metric, meaning in recipe.expected_metrics.items():
        lines.append(f"expected metric {metric}: {meaning}")
    for gate in recipe.gates:
        lines.append(f"gate: {gate.describe()}")
    return "".join(f"# {line}\n" for line in lines)


def _recipe_sets(
    options: Mapping[str, Any], explicit: frozenset[str]
) -> tuple[list[str], list[str]]:
    kept: list[str] = []
    overridden: list[str] = []
    for name in options:
        if name == "algo":
            continue
        (overridden if name in explicit else kept).append(name)
    return kept, overridden

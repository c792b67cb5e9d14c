"""Entry point of the math pack: registers its loaders, rewards, recipes and evaluators."""

from __future__ import annotations

from areno_core import hookimpl
from areno_recipes_math.evaluate import EVALUATORS
from areno_recipes_math.loaders import (
    arith_loader,
    arith_sft_loader,
    gsm8k_loader,
    numina_loader,
)
from areno_recipes_math.recipes import RECIPES
from areno_recipes_math.reward import exact_match_reward_fn, math_verify_reward_fn


@hookimpl
def register_dataset_loaders(register):  # type: ignore[no-untyped-def]
    register("gsm8k", gsm8k_loader)
    register("numinamath", numina_loader)
    register("arith", arith_loader)
    register("arith_sft", arith_sft_loader)


@hookimpl
def register_rewards(register):  # type: ignore[no-untyped-def]
    register("math_verify", math_verify_reward_fn)
    register("exact_match", exact_match_reward_fn)


@hookimpl
def register_recipes(register):  # type: ignore[no-untyped-def]
    for recipe in RECIPES:
        register(recipe)


@hookimpl
def register_evaluators(register):  # type: ignore[no-untyped-def]
    for evaluator in EVALUATORS:
        register(evaluator)

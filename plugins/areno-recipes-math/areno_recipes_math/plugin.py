"""Entry point of the math pack: registers its loaders, rewards, recipes and evaluators."""

from __future__ import annotations

from areno_core import Pack
from areno_recipes_math.evaluate import EVALUATORS
from areno_recipes_math.loaders import (
    arith_loader,
    arith_sft_loader,
    gsm8k_loader,
    numina_loader,
)
from areno_recipes_math.recipes import RECIPES
from areno_recipes_math.reward import exact_match_reward_fn, math_verify_reward_fn

PACK = Pack(
    dataset_loaders={
        "gsm8k": gsm8k_loader,
        "numinamath": numina_loader,
        "arith": arith_loader,
        "arith_sft": arith_sft_loader,
    },
    rewards={"math_verify": math_verify_reward_fn, "exact_match": exact_match_reward_fn},
    recipes=RECIPES,
    evaluators=EVALUATORS,
)

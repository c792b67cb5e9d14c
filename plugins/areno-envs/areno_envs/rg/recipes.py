"""Recipes for reasoning-gym: ``rg/<task>`` for every installed task, and ``rg-cpu/chain_sum``.

    areno train --algo grpo --recipe rg/countdown --save-path runs/countdown   # one GPU
    areno train --algo gspo --recipe rg-cpu/chain_sum --save-path runs/chain   # this CPU

``rg/<task>`` generates 2,000 training problems (seed 0) and 200 held-out ones from the same
seeded dataset, sharing no question with the training ones, and scores completions with the
task's own ``score_answer``. It asks Qwen3-0.6B for reasoning-gym's ``<answer>`` format.
``rg-cpu/basic_arithmetic`` is the CPU recipe whose held-out accuracy rises (0.342 -> 0.580 in
500 steps, about 7 minutes at one torch thread) from a warm start shipped in this package (made
by ``rg-cpu/basic_arithmetic-sft``); ``rg-cpu/basic_arithmetic-learn`` is its first 150 steps as
an opt-in learning gate. ``rg-cpu/chain_sum`` raises only its sampled reward (over 300 steps,
about 30 minutes): its held-out problems are harder than its training ones.
"""

from __future__ import annotations

import functools

from areno_algos import recipe_kit

from areno_core.recipe import Gate, Recipe

RESOURCE = "resource:areno_envs"
RG_TRAIN = f"{RESOURCE}/data/rg_train.jsonl"
RG_EVAL = f"{RESOURCE}/data/rg_eval.jsonl"
CHAIN_TRAIN = f"{RESOURCE}/data/chain_sum_train.jsonl"
CHAIN_EVAL = f"{RESOURCE}/data/chain_sum_eval.jsonl"
CHAIN_WARMSTART = f"{RESOURCE}/checkpoints/chain-sum-sft"
# rloo also works with these rows and reward (pass the options yourself); each algorithm a
# recipe lists costs a configuration check per recipe every time a registry is built.
RG_ALGORITHMS = ("grpo", "gspo")

# Qwen3-0.6B on one GPU, as math/gsm8k (same memory arithmetic: about 16 GiB at peak).
_RG_DEFAULTS = {
    **recipe_kit.qwen3_rl_one_gpu(max_prompt_tokens=1024, epochs=4),
    "eval_dataset_path": RG_EVAL,
    "eval_interval": 50,
}


# Built once per process: a Recipe checks its options when made (about 3 ms each, 106 tasks),
# and tests rebuild the registry many times.
@functools.cache
def task_recipe(task: str) -> Recipe:
    """The ``rg/<task>`` recipe."""
    return Recipe(
        name=f"rg/{task}",
        summary=f"reasoning-gym '{task}': generated problems scored by the task's own scorer.",
        algorithms=RG_ALGORITHMS,
        dataset=RG_TRAIN,
        checkpoint="Qwen/Qwen3-0.6B",
        loader=f"rg/{task}",
        reward="rg",
        defaults=_RG_DEFAULTS,
        hardware=recipe_kit.one_gpu_floor(
            "estimated as math/gsm8k (same model and batch shape); not measured per task"
        ),
        expected_metrics={
            "rollout/reward_mean": "not measured by this pack; depends on the task's difficulty",
            "rollout/reward_errors": "0: the scorer gets None for a completion without tags",
        },
        gates=(
            Gate("metric_exists", "rollout/reward_mean", description="rewards were computed"),
            recipe_kit.FINITE_LOSS,
            recipe_kit.scorer_never_fails("the scorer never fails"),
        ),
        description=(
            f"Problems of reasoning-gym's '{task}' task with its default options: 2,000 for "
            "training (seed 0, indices 0-1999) and up to 200 held-out (indices 2000-2199, "
            "questions also in the training set dropped). The prompt is reasoning-gym's "
            "default system prompt and the question; the reward is the task's score_answer "
            "of the last <answer>...</answer>. To change the task's options, the seed or the "
            "sizes, pass a spec file with --dataset-path (see docs/recipes/environments.md)."
        ),
    )


SCORER_NEVER_FAILS = recipe_kit.scorer_never_fails("reasoning-gym's scorer never fails")

# The tiny model and schedules of math/arith, with longer prompts.
_CHAIN_COMMON = recipe_kit.arithmetic_common(max_prompt_tokens=80)

# Greedy accuracy on the 450 held-out problems (two-digit ones: the one-digit problems all
# occur in training) at steps 0, 50, ..., 300; about 2 s each.
_CHAIN_RL = recipe_kit.arithmetic_rl(max_steps=300, eval_dataset_path=CHAIN_EVAL, eval_interval=50)

CHAIN_SUM_SFT = Recipe(
    name="rg-cpu/chain_sum-sft",
    summary="The SFT run that made rg-cpu/chain_sum's shipped warm start (CPU).",
    algorithms=("sft",),
    dataset=CHAIN_TRAIN,
    checkpoint=recipe_kit.TINY_QWEN3,
    loader="rg_sft",
    # Stops at 400 of a 1000-step schedule: the model then solves a minority of the held-out
    # problems.
    defaults={**_CHAIN_COMMON, **recipe_kit.arithmetic_sft(max_steps=400, save_interval=200)},
    hardware=recipe_kit.cpu_floor("measured on 2 CPU cores"),
    expected_metrics={
        "train/loss": "5.78 at step 1, 1.66 mean over the first third, 0.73 over steps 350-400",
        "time/step": "2.3 s per step on 2 CPU cores shared with other jobs (15 min in all)",
    },
    gates=(
        recipe_kit.FINITE_LOSS,
        recipe_kit.loss_falls(0.5, "1.66 -> 0.79"),
        Gate(
            "at_most",
            "train/loss",
            threshold=0.9,
            after_step=350,
            description="measured 0.725 over steps 350-400",
        ),
        recipe_kit.warm_start_loads(400),
    ),
    description=(
        "`scripts/make_chain_sum_warmstart.sh` runs this recipe and exports its last step "
        "into areno_envs/checkpoints/chain-sum-sft."
    ),
)

CHAIN_SUM = Recipe(
    name="rg-cpu/chain_sum",
    summary="reasoning-gym chain_sum (two terms) on CPU: RL lifts the sampled reward in 300 steps.",
    algorithms=("gspo", "grpo"),
    dataset=CHAIN_TRAIN,
    checkpoint=CHAIN_WARMSTART,
    loader="rg/chain_sum",
    reward="rg",
    defaults=_CHAIN_COMMON,
    algorithm_defaults=recipe_kit.arithmetic_rl_by_algorithm(_CHAIN_RL),
    hardware=recipe_kit.cpu_floor(
        "measured on 2 CPU cores; peak RSS of a run is about 0.65 GiB; no GPU needed"
    ),
    expected_metrics={
        "rollout/reward_mean": (
            "reasoning-gym's score of the samples (temperature 1): 0.343 mean over steps 1-50, "
            "0.426 over steps 251-300 with gspo (measured)"
        ),
        "eval/accuracy": (
            "greedy, the 450 held-out two-digit problems: 0.058 at step 0, 0.067-0.076 from "
            "step 50 on (measured, gspo): the gain is on the training distribution"
        ),
        "rollout/reward_errors": "0: the scorer never fails",
        "time/step": "about 6 s per step on 2 CPU cores shared with two other jobs",
    },
    gates=(
        recipe_kit.FINITE_LOSS,
        SCORER_NEVER_FAILS,
        recipe_kit.reward_rises("+0.063"),
        Gate(
            "at_least",
            "rollout/reward_mean",
            threshold=0.39,
            after_step=250,
            description="measured 0.426 over steps 251-300, from 0.343 over steps 1-50",
        ),
        Gate(
            "at_least",
            "eval/accuracy",
            threshold=0.05,
            after_step=300,
            description="held-out accuracy does not fall below the warm start's 0.058 by "
            "much (measured 0.067 at step 300)",
        ),
        Gate("checkpoint_loadable", after_step=300, description="the final policy loads"),
    ),
    description=(
        "reasoning-gym's chain_sum with two terms of one or two digits, as plain text "
        "('State the final answer to the following arithmetic problem: 15 - 43 = '), the "
        "completion the number. It starts from the shipped SFT warm start (see "
        "rg-cpu/chain_sum-sft). Half the problems have one-digit terms, which all occur in "
        "training, so the 450 held-out problems are two-digit ones."
    ),
)

# The CI gate: the first steps of rg-cpu/chain_sum, short enough for the default CI run (see
# the pack README for its measured time). Whether RL learns is rg-cpu/chain_sum's own gates.
CHAIN_SUM_SMOKE = Recipe(
    name="rg-cpu/chain_sum-smoke",
    summary="CI gate: a few steps of rg-cpu/chain_sum through the real reasoning-gym scorer.",
    algorithms=("gspo",),
    dataset=CHAIN_TRAIN,
    checkpoint=CHAIN_WARMSTART,
    loader="rg/chain_sum",
    reward="rg",
    defaults={
        **_CHAIN_COMMON,
        **_CHAIN_RL,
        **recipe_kit.ARITHMETIC_GSPO_CLIP,
        "batch_size": 16,
        "mini_bs": 32,
        "max_steps": 8,
        "save_interval": 8,
        "eval_interval": 8,
        "eval_limit": 100,
    },
    hardware=recipe_kit.cpu_floor("measured on 2 CPU cores"),
    visibility="internal",
    expected_metrics={
        "rollout/reward_mean": "0.30 mean over the 8 steps (measured; the warm start's level)",
        "eval/accuracy": "0.05 at step 0 and 0.06 at step 8 on the first 100 held-out problems",
        "time/step": "4.3 s per step on 2 CPU cores shared with another run; 48 s in all",
    },
    gates=(
        recipe_kit.FINITE_LOSS,
        SCORER_NEVER_FAILS,
        Gate(
            "at_least",
            "rollout/reward_mean",
            threshold=0.15,
            after_step=1,
            description="the warm start scores through the real scorer: measured 0.30",
        ),
        Gate(
            "at_least",
            "eval/accuracy",
            threshold=0.03,
            after_step=0,
            description="held-out greedy accuracy is logged and the warm start solves some "
            "(measured 0.05, 0.06)",
        ),
        Gate("checkpoint_loadable", after_step=8, description="the last policy loads"),
    ),
)

ADD_TRAIN = f"{RESOURCE}/data/basic_arithmetic_train.jsonl"
ADD_EVAL = f"{RESOURCE}/data/basic_arithmetic_eval.jsonl"  # 609 rows, none a training question
ADD_WARMSTART = f"{RESOURCE}/checkpoints/basic-arithmetic-sft"

# The tiny model of chain_sum with basic_arithmetic's shorter prompts.
_ADD_COMMON = recipe_kit.arithmetic_common(max_prompt_tokens=32)

ADD_SFT = Recipe(
    name="rg-cpu/basic_arithmetic-sft",
    summary="The SFT run that made rg-cpu/basic_arithmetic's shipped warm start (CPU).",
    algorithms=("sft",),
    dataset=ADD_TRAIN,
    checkpoint=recipe_kit.TINY_QWEN3,
    loader="rg_sft",
    defaults={
        **_ADD_COMMON,
        **recipe_kit.arithmetic_sft(max_steps=700, save_interval=700),
        # Stops at 700 of a 1400-step schedule: held-out accuracy is then 0.34 and still
        # climbing (the same schedule run on reaches 0.92 by step 1100), which leaves RL room.
        "lr_decay_steps": 1400,
    },
    hardware=recipe_kit.cpu_floor("measured on 2 CPU cores"),
    expected_metrics={
        "train/loss": "5.72 at step 1, 1.40 mean over the first third, 0.58 over steps 650-700",
        "time/step": "0.28 s per step at one torch thread on 2 shared CPU cores (3 min 15 s)",
    },
    gates=(
        recipe_kit.FINITE_LOSS,
        recipe_kit.loss_falls(0.4, "1.40 -> 0.73"),
        Gate(
            "at_most",
            "train/loss",
            threshold=0.8,
            after_step=650,
            description="measured 0.58 over steps 650-700",
        ),
        recipe_kit.warm_start_loads(700),
    ),
    description=(
        "`scripts/make_basic_arithmetic_warmstart.sh` runs this recipe at one torch thread and "
        "exports its last step into areno_envs/checkpoints/basic-arithmetic-sft (two runs gave "
        "the same weights bit for bit). The warm start solves 34.2% of the 609 held-out "
        "problems greedily."
    ),
)

# math/arith's RL options with basic_arithmetic's shorter prompts and answers. Greedy accuracy
# on the 609 held-out problems at steps 0, 100, ..., 500; about 1 s each.
_ADD_RL = {
    **recipe_kit.arithmetic_rl(max_steps=500, eval_dataset_path=ADD_EVAL, eval_interval=100),
    "max_prompt_tokens": 32,
    "max_new_tokens": 5,  # at most 3 digits, then EOS
}

ADD = Recipe(
    name="rg-cpu/basic_arithmetic",
    summary="reasoning-gym basic_arithmetic (two-digit sums) on CPU: held-out accuracy rises.",
    algorithms=("gspo", "grpo"),
    dataset=ADD_TRAIN,
    checkpoint=ADD_WARMSTART,
    loader="rg/basic_arithmetic",
    reward="rg",
    defaults=_ADD_COMMON,
    algorithm_defaults=recipe_kit.arithmetic_rl_by_algorithm(_ADD_RL),
    hardware=recipe_kit.cpu_floor("measured on 2 CPU cores; no GPU needed"),
    expected_metrics={
        "eval/accuracy": (
            "greedy, the 609 held-out problems: 0.342 at step 0 (the warm start), 0.502 (gspo) "
            "and 0.509 (grpo) at step 100, 0.580 (gspo) and 0.565 (grpo) at step 500 "
            "(measured, one torch thread)"
        ),
        "rollout/reward_mean": (
            "reasoning-gym's score of the samples (temperature 1): 0.288 mean over steps 1-50, "
            "0.551 (gspo) and 0.543 (grpo) over steps 451-500 (measured)"
        ),
        "rollout/reward_errors": "0: the scorer never fails",
        "time/step": "0.83 s per step at one torch thread on 2 shared CPU cores (7 min in all)",
    },
    gates=(
        recipe_kit.FINITE_LOSS,
        SCORER_NEVER_FAILS,
        Gate(
            "rises",
            "rollout/reward_mean",
            threshold=0.08,
            description="last third beats first third (measured: +0.154 gspo, +0.153 grpo)",
        ),
        Gate(
            "at_least",
            "eval/accuracy",
            threshold=0.48,
            after_step=500,
            description="held-out accuracy at the end; measured 0.580 (gspo), 0.565 (grpo), "
            "from 0.342",
        ),
        Gate("checkpoint_loadable", after_step=500, description="the final policy loads"),
    ),
    description=(
        "reasoning-gym's basic_arithmetic restricted to sums of two terms from 0 to 100 "
        "(operators ['+'], no parentheses, no negation), as plain text ('Calculate 32 + 15.'), "
        "the completion the number. Training and held-out problems come from the same "
        "generator: 5,000 training problems (seed 0, indices 0-4999) and the 609 of indices "
        "5000-5999 whose question is not a training one. It starts from the shipped SFT warm "
        "start (see rg-cpu/basic_arithmetic-sft), which solves 34.2% of them greedily."
    ),
)

# The opt-in learning gate (scripts/dev.sh runs it with ARENO_LEARNING_GATES=1; not in the
# default CI run): the first 150 steps of rg-cpu/basic_arithmetic must raise held-out accuracy.
ADD_LEARN = Recipe(
    name="rg-cpu/basic_arithmetic-learn",
    summary="Learning gate: 150 steps of rg-cpu/basic_arithmetic must raise held-out accuracy.",
    algorithms=("gspo",),
    dataset=ADD_TRAIN,
    checkpoint=ADD_WARMSTART,
    loader="rg/basic_arithmetic",
    reward="rg",
    defaults={
        **_ADD_COMMON,
        **_ADD_RL,
        **recipe_kit.ARITHMETIC_GSPO_CLIP,
        "max_steps": 150,
        "save_interval": 150,
        "eval_interval": 50,
    },
    hardware=recipe_kit.cpu_floor("measured on 2 CPU cores"),
    visibility="internal",
    expected_metrics={
        "eval/accuracy": "0.342, 0.401, 0.502, 0.521 at steps 0, 50, 100, 150 (measured, seed 0)",
        "rollout/reward_mean": "0.288 over steps 1-50, 0.429 over steps 101-150 (measured)",
        "time/step": "0.8 s per step at one torch thread; 116 s in the smoke matrix",
    },
    gates=(
        recipe_kit.FINITE_LOSS,
        SCORER_NEVER_FAILS,
        Gate(
            "rises",
            "eval/accuracy",
            threshold=0.08,
            description="step 150 beats step 0 (the warm start, 0.342): measured +0.179, "
            "+0.169, +0.164 with seeds 0, 1, 2",
        ),
        Gate(
            "rises",
            "rollout/reward_mean",
            threshold=0.03,
            description="last third beats first third (measured +0.141, +0.144, +0.126)",
        ),
        Gate("checkpoint_loadable", after_step=150, description="the last policy loads"),
    ),
    description=(
        "Internal: fails when RL on a reasoning-gym task stops improving held-out accuracy "
        "(a reward that no longer reaches the update, an update that no longer helps)."
    ),
)

CHAIN_SUM_RECIPES: tuple[Recipe, ...] = (CHAIN_SUM, CHAIN_SUM_SFT, CHAIN_SUM_SMOKE)
ADD_RECIPES: tuple[Recipe, ...] = (ADD, ADD_SFT, ADD_LEARN)
CPU_RECIPES: tuple[Recipe, ...] = (*CHAIN_SUM_RECIPES, *ADD_RECIPES)

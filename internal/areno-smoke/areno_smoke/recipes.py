"""One tiny CPU smoke recipe per algorithm, with the gates that say a run is healthy.

Every recipe trains ``random:qwen3-tiny`` for a few steps on the packaged arithmetic fixture.
The gates check plumbing, not learning quality: the metrics each algorithm promises are
logged and finite, the loss moves the right way where a few steps are enough to show it (SFT,
DPO), the reward stays within its range, and the final checkpoint loads.

    areno train --recipe smoke/grpo --save-path /tmp/smoke-grpo   # one of them, by hand
    python -m areno_smoke                                         # all of them, gated
"""

from __future__ import annotations

import attrs
from areno_algos.recipe_kit import cpu_floor

from areno_core.recipe import Gate, Recipe

FIXTURE = "resource:areno_smoke/data/arith.jsonl"
REWARD = "resource:areno_smoke/rewards.py:digit_share_reward_fn"
CPU = cpu_floor("2 cores are enough")

COMMON = {
    "seed": 0,
    "activation_checkpointing": False,
    "attn_backend": "native",
    "save_interval": 1000,  # one checkpoint, at the last step
    "lr_decay_style": "constant",
}
ONLINE = {
    **COMMON,
    "max_steps": 2,
    "batch_size": 4,
    "n_samples": 4,
    "mini_bs": 4,
    "gradient_accumulation_steps": 1,
    "max_new_tokens": 12,
    "lr": 1e-3,
    "min_lr": 1e-3,
}
# SFT and DPO: 6 steps of 8 rows.
OFFLINE = {**COMMON, "max_steps": 6, "batch_size": 8, "mini_bs": 8}
LOADS = Gate("checkpoint_loadable", description="the last checkpoint loads as a HF model")
LOGGED_ONLINE = (
    "rollout/accuracy",
    "rollout/truncation_rate",
    "rollout/response_length_mean",
    "train/clip_fraction",
    "train/lr",
    "time/rollout",
    "time/train",
)


def _finite(*metrics: str) -> tuple[Gate, ...]:
    return tuple(Gate("finite", m) for m in metrics)


def _smoke(
    algo: str,
    *,
    summary: str,
    loader: str,
    defaults: dict[str, object],
    expected_metrics: dict[str, str],
    gates: tuple[Gate, ...],
    reward: str | None = None,
) -> Recipe:
    """``smoke/<algo>``: the tiny model on the packaged fixture, on the CPU, internal."""
    return Recipe(
        name=f"smoke/{algo}",
        summary=summary,
        algorithms=(algo,),
        dataset=FIXTURE,
        loader=loader,
        reward=reward,
        checkpoint="random:qwen3-tiny",
        defaults=defaults,
        hardware=CPU,
        expected_metrics=expected_metrics,
        gates=gates,
        visibility="internal",
        description=f"Internal smoke test of --algo {algo}; not a public recipe.",
    )


def _online(algo: str, extra_defaults: dict[str, object], *extra_gates: Gate) -> Recipe:
    return _smoke(
        algo,
        summary=f"{algo.upper()} smoke: 2 steps, 4 prompts x 4 samples x 12 tokens",
        loader="smoke_prompts",
        reward=REWARD,
        defaults={**ONLINE, **extra_defaults},
        expected_metrics={
            "rollout/reward_mean": "mean digit share of the sampled completions",
            "rollout/response_length_mean": "sampled completion length, tokens",
            "train/lr": "learning rate",
            "time/rollout": "seconds spent sampling",
            "time/train": "seconds spent in the update",
        },
        # CI trains each online algorithm at this size here only (tests/test_e2e_train.py's
        # run of the same shape is marked slow), so the gates hold what that test checks.
        gates=(
            *_finite("train/policy_loss", "train/grad_norm", "train/ratio_mean"),
            Gate("at_least", "rollout/reward_mean", threshold=0.0, after_step=1),
            Gate("at_most", "rollout/reward_mean", threshold=1.0, after_step=1),
            *(Gate("metric_exists", m) for m in LOGGED_ONLINE),
            # 16 samples in minibatches of 4, one each: 4 optimizer steps per trainer step...
            Gate("at_least", "train/optimizer_steps", threshold=4.0),
            Gate("at_most", "train/optimizer_steps", threshold=4.0),
            # ...so the later minibatches see a moved policy and their ratios leave 1.
            Gate("at_least", "train/ratio_max", threshold=1.0001),
            *extra_gates,
            LOADS,
        ),
    )


SMOKE_SFT = _smoke(
    "sft",
    summary="SFT smoke: 6 steps of 8 arithmetic answers; loss must fall",
    loader="smoke_sft",
    defaults={**OFFLINE, "max_new_tokens": 32, "lr": 3e-3, "min_lr": 3e-3},
    expected_metrics={"train/lr": "learning rate", "time/train": "seconds in the update"},
    gates=(
        *_finite("train/loss", "train/grad_norm"),
        Gate("falls", "train/loss", threshold=0.5, description="6 steps at lr 3e-3 learn"),
        LOADS,
    ),
)

SMOKE_DPO = _smoke(
    "dpo",
    summary="DPO smoke: 6 steps of 8 pairs; margin must rise",
    loader="smoke_preferences",
    defaults={**OFFLINE, "lr": 2e-3, "min_lr": 2e-3, "dpo_beta": 0.1},
    expected_metrics={"train/rewards/accuracy": "share of pairs ranked right"},
    gates=(
        *_finite("train/loss", "train/rewards/margin"),
        Gate("rises", "train/rewards/margin", threshold=1.0, description="it learns the pairs"),
        Gate("at_least", "train/rewards/accuracy", threshold=0.5, after_step=4),
        LOADS,
    ),
)

# LoRA: smoke/dpo with adapters the recipe requires and sets itself (same data, model and
# gates); the reference is the base model (the policy with its adapters off) and the
# checkpoint an adapter in PEFT's format.
SMOKE_DPO_LORA = attrs.evolve(
    SMOKE_DPO,
    name="smoke/dpo-lora",
    summary="DPO with rank-8 LoRA adapters: 6 steps of 8 pairs; margin must rise",
    defaults={**SMOKE_DPO.defaults, "lora_rank": 8, "lr": 2e-2, "min_lr": 2e-2},
    lora_required=True,
    description="Internal smoke test of --algo dpo with --lora-rank; not a public recipe.",
)

SMOKE_RECIPES: tuple[Recipe, ...] = (
    SMOKE_SFT,
    SMOKE_DPO,
    SMOKE_DPO_LORA,
    _online("grpo", {}),
    _online("gspo", {}),
    _online("rloo", {}),
    _online(
        "ppo",
        {"critic_warmup_steps": 1},
        *_finite("train/value_loss"),
        Gate("metric_exists", "rollout/explained_variance"),
    ),
)

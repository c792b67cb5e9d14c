"""Pieces the recipe packs share: hardware floors, health gates and tuned option tables.

The math, environments, agentic and smoke packs all depend on this package, so what their
recipes declare alike lives here once:

- the hardware floors of a 2-core CPU run and of Qwen3-0.6B on one 24 GiB GPU;
- the gates that say a run is healthy (finite loss, a scorer that never fails, a checkpoint
  that loads) and the measured ones phrased the same way in every pack;
- the tiny byte-level Qwen3 of the CPU warm starts, and the SFT and RL schedules tuned for it
  on one-line arithmetic (math/arith, then reused unchanged by rg-cpu/chain_sum);
- the options of a Qwen3-0.6B RL run on one GPU (math/gsm8k, reused by rg/<task>).

A recipe spreads a table into its own defaults and adds what is its own, so each recipe still
reads as the full list of what it sets.
"""

from __future__ import annotations

from typing import Any

from areno_core.recipe import Gate, HardwareFloor

# -- hardware ---------------------------------------------------------------------------------


def cpu_floor(note: str) -> HardwareFloor:
    """A CPU run that fits in 2 GiB of RAM (every CPU recipe's floor), with its own note."""
    return HardwareFloor(device="cpu", min_cpu_memory_gb=2, note=note)


def one_gpu_floor(note: str, *, min_cpu_memory_gb: float = 0.0) -> HardwareFloor:
    """One 24 GiB GPU: what a full fine-tune of Qwen3-0.6B with rollouts is estimated to need."""
    return HardwareFloor(
        device="cuda",
        min_gpus=1,
        min_gpu_memory_gb=24,
        min_cpu_memory_gb=min_cpu_memory_gb,
        note=note,
    )


# -- gates ------------------------------------------------------------------------------------

FINITE_LOSS = Gate("finite", "train/loss", description="no NaN or inf in the loss")


def scorer_never_fails(description: str) -> Gate:
    """No reward call fails from the first step on (``rollout/reward_errors`` stays 0)."""
    return Gate(
        "at_most", "rollout/reward_errors", threshold=0.0, after_step=1, description=description
    )


def reward_rises(measured: str, *, threshold: float = 0.03) -> Gate:
    """The sampled reward of the run's last third beats its first third."""
    return Gate(
        "rises",
        "rollout/reward_mean",
        threshold=threshold,
        description=f"last third of the run beats the first third (measured: {measured})",
    )


def loss_falls(threshold: float, measured: str) -> Gate:
    """The SFT loss of the run's last third is below its first third's by ``threshold``."""
    return Gate("falls", "train/loss", threshold=threshold, description=f"measured: {measured}")


def warm_start_loads(step: int) -> Gate:
    """The SFT checkpoint a pack ships as its warm start loads."""
    return Gate(
        "checkpoint_loadable", after_step=step, description=f"step_{step} is the warm start"
    )


# -- the tiny model on one-line arithmetic ----------------------------------------------------

# The warm starts' architecture: 822,656 parameters, 3.3 MB in float32, byte tokenizer.
TINY_QWEN3 = (
    "random:qwen3?hidden_size=128&num_hidden_layers=4&num_attention_heads=4"
    "&num_key_value_heads=2&intermediate_size=384"
)


def arithmetic_common(max_prompt_tokens: int) -> dict[str, Any]:
    """What every run of the tiny model on an arithmetic task sets, whatever the algorithm."""
    return {
        "activation_checkpointing": False,
        "max_prompt_tokens": max_prompt_tokens,
        "attn_backend": "native",
        "epochs": 100,
        "seed": 0,
    }


def arithmetic_sft(*, max_steps: int, save_interval: int) -> dict[str, Any]:
    """The SFT schedule that makes a warm start: a 1000-step decay stopped at ``max_steps`` on
    purpose, so the model solves only part of the held-out problems and RL has room to show."""
    return {
        "batch_size": 64,
        "mini_bs": 64,
        "max_new_tokens": 8,
        "lr": 3.0e-3,
        "min_lr": 3.0e-4,
        "lr_decay_steps": 1000,
        "max_steps": max_steps,
        "save_interval": save_interval,
    }


def arithmetic_rl(*, max_steps: int, eval_dataset_path: str, eval_interval: int) -> dict[str, Any]:
    """The online algorithms' options from a warm start, with greedy held-out accuracy logged
    every ``eval_interval`` steps.

    A step samples 32 prompts x 8 completions at temperature 1; minibatches of 64 rows, one
    microbatch each, make 4 optimizer steps per rollout, so the importance ratios move within
    a step and the clip acts. lr 1e-4 is the largest of those tried on math/arith (1e-4, 3e-4,
    1e-3) that does not first lose accuracy; at 1e-3 the sampled reward collapses to 0 within
    60 steps.
    """
    return {
        "batch_size": 32,
        "n_samples": 8,
        "mini_bs": 64,
        "gradient_accumulation_steps": 1,
        "max_new_tokens": 6,  # at most 3 digits and a sign, then the end-of-sequence token
        "temperature": 1.0,
        "lr": 1.0e-4,
        "min_lr": 1.0e-5,
        "lr_decay_steps": 1000,
        "max_steps": max_steps,
        "save_interval": 100,
        "eval_dataset_path": eval_dataset_path,
        "eval_interval": eval_interval,
    }


# GSPO's published band (3e-4 / 4e-4) assumes a large model taking small steps. With the tiny
# model the sequence ratios reach 1.2-1.3 within the 4 updates of a step, so with that band ~30%
# of the rows of every step are clipped (no gradient); with 0.05 it is 1-8%, and math/arith's
# held-out accuracy after 500 steps was 0.478 against 0.460.
ARITHMETIC_GSPO_CLIP = {"gspo_clip_eps": 0.05, "gspo_clip_eps_high": 0.05}


def arithmetic_rl_by_algorithm(rl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``algorithm_defaults`` for gspo and grpo: the RL table with each one's clip band."""
    return {
        "gspo": {**rl, **ARITHMETIC_GSPO_CLIP},
        "grpo": {**rl, "grpo_clip_eps": 0.2},
    }


# -- Qwen3-0.6B on one GPU --------------------------------------------------------------------


def qwen3_rl_one_gpu(*, max_prompt_tokens: int, epochs: int) -> dict[str, Any]:
    """An RL run of Qwen3-0.6B on one GPU: 16 prompts x 8 samples, 64 sequences in flight,
    32 rows per optimizer step (4 steps per rollout), thinking off so answers fit in 1024
    tokens, the rollout state dropped before the update (math/gsm8k's arithmetic of about
    16 GiB at peak)."""
    return {
        "batch_size": 16,
        "n_samples": 8,
        "max_running_prompts": 64,
        "mini_bs": 4,
        "gradient_accumulation_steps": 8,
        "max_prompt_tokens": max_prompt_tokens,
        "max_new_tokens": 1024,
        "temperature": 1.0,
        "disable_thinking": True,
        "drop_rollout_state": True,
        "lr": 1.0e-6,
        "min_lr": 1.0e-7,
        "lr_decay_steps": 500,
        "epochs": epochs,
        "save_interval": 50,
    }

"""The ``mypack/echo`` recipe: option defaults and metadata, no code of its own."""

from __future__ import annotations

from areno_core.recipe import Gate, HardwareFloor, Recipe

ECHO_RECIPE = Recipe(
    name="mypack/echo",
    summary="Teach a tiny random model to repeat short texts (GRPO or RLOO, CPU, seconds).",
    algorithms=("grpo", "rloo"),
    # Files shipped inside the package are referenced as resource:<package>/<path>.
    dataset="resource:areno_mypack/data/echo.jsonl",
    checkpoint="random:qwen3-tiny",
    loader="mypack_echo",  # registered names, from this package (a file would also do:
    reward="mypack_echo",  # "resource:areno_mypack/reward.py:score")
    defaults={  # run options by name, as in `areno train --help`
        "batch_size": 4,
        "n_samples": 4,
        "max_new_tokens": 16,
        "mini_bs": 8,
        "gradient_accumulation_steps": 1,
        "lr": 1.0e-3,
        "min_lr": 1.0e-4,
        "epochs": 2,
        "activation_checkpointing": False,
        "attn_backend": "native",
    },
    algorithm_defaults={
        "grpo": {"grpo_clip_eps": 0.2},
        "rloo": {"clip_eps": 0.2},
    },
    hardware=HardwareFloor(device="cpu", min_cpu_memory_gb=2),
    expected_metrics={
        "rollout/reward_mean": "about 0.1 for the untrained model; higher is better",
        "train/loss": "finite, near 0 (group-normalised advantages average out)",
    },
    gates=(
        Gate(kind="finite", metric="train/loss", description="the loss stays finite"),
        Gate(kind="metric_exists", metric="rollout/reward_mean"),
    ),
    visibility="public",
    description="A worked example for plugin authors; see docs/plugin-authors.md in areno.",
)

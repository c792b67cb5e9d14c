"""Recipes of the agentic pack: tic-tac-toe and DuelGrid, on a GPU and as CPU smoke runs.

    areno train --recipe agentic/tictactoe --save-path runs/ttt         # Qwen3-0.6B, 1 GPU
    areno train --recipe agentic/duelgrid --algo grpo --save-path runs/dg
    areno train --recipe agentic/tictactoe-cpu --save-path /tmp/ttt     # internal, CPU, seconds

Datasets ship inside the package (``data/``), made with the pack's generators:

    python -m areno_recipes_agentic.tictactoe.generate --output .../data/tictactoe.jsonl \\
        --count 256 --seed 2026
    python -m areno_recipes_agentic.duelgrid.generate --output .../data/duelgrid.jsonl \\
        --count 256 --seed 2026 --turns 2

Reference rewards on those files, computed with the pack's own reward functions (see
``tests/test_recipes.py``), give the expected metrics a scale:

* tic-tac-toe: a random free square scores 0.49 on average, a random square from 1 to 9
  (occupied ones included) 0.20, perfect play 1.0;
* DuelGrid (2 rounds): doing nothing scores 0.17, random action lists 0.15, the scripted
  chase-and-attack policy 0.46.

How Qwen3-0.6B starts and how far it gets has not been measured in areno yet; the GPU recipes'
gates therefore check that a run is healthy (rewards logged, finite loss, loadable checkpoint)
and their expected metrics say what to look for, not a promise.

The CPU variants are internal: a randomly initialised byte-level model never produces a tool
call, so their rewards stay near 0. They exist to run the whole agentic path (agent, local
endpoint, token rows, reward, update, checkpoint) in tests and smoke runs, not to train
anything, which is why they are not offered to users.
"""

from __future__ import annotations

from areno_core.recipe import Gate, HardwareFloor, Recipe

PACKAGE = "areno_recipes_agentic"
TICTACTOE_DATA = f"resource:{PACKAGE}/data/tictactoe.jsonl"
DUELGRID_DATA = f"resource:{PACKAGE}/data/duelgrid.jsonl"

GPU = HardwareFloor(
    device="cuda",
    min_gpus=1,
    min_gpu_memory_gb=24,
    note=(
        "estimate for full fine-tuning of a 0.6B model: bf16 weights, fp32 AdamW state and "
        "gradients (about 10 GiB) plus rollout cache and activations; not yet measured"
    ),
)
CPU = HardwareFloor(device="cpu", min_cpu_memory_gb=2, note="2 cores are enough")

HEALTHY = (
    Gate("metric_exists", "rollout/reward_mean", description="rewards are logged"),
    Gate("finite", "train/loss", description="the loss stays finite"),
    Gate("checkpoint_loadable", description="the last checkpoint loads as a HF model"),
)
IN_RANGE = (
    Gate("at_least", "rollout/reward_mean", threshold=0.0, description="rewards lie in [0, 1]"),
    Gate("at_most", "rollout/reward_mean", threshold=1.0, description="rewards lie in [0, 1]"),
)

# Qwen3 thinks before it answers unless told not to; a move fits in a few dozen tokens.
QWEN_COMMON = {
    "disable_thinking": True,
    "temperature": 1.0,
    "save_interval": 50,
    "lr": 1.0e-6,
}
CPU_COMMON = {
    "seed": 0,
    "max_steps": 2,
    "batch_size": 2,
    "n_samples": 2,
    "mini_bs": 4,
    "gradient_accumulation_steps": 1,
    "max_new_tokens": 16,
    "lr": 1.0e-3,
    "min_lr": 1.0e-3,
    "lr_decay_style": "constant",
    "activation_checkpointing": False,
    "attn_backend": "native",
    "save_interval": 1000,
    "agent_timeout_s": 120.0,
}

TICTACTOE = Recipe(
    name="agentic/tictactoe",
    summary="Tic-tac-toe moves through a choose_square tool call, scored against perfect play",
    algorithms=("gspo", "grpo"),
    dataset=TICTACTOE_DATA,
    loader="tictactoe",
    reward="tictactoe",
    agent="tictactoe",
    checkpoint="Qwen/Qwen3-0.6B",
    defaults={
        **QWEN_COMMON,
        "batch_size": 32,
        "n_samples": 8,
        "mini_bs": 8,
        "max_new_tokens": 64,
        "max_prompt_tokens": 1024,
        "epochs": 25,
        "max_steps": 200,
    },
    hardware=GPU,
    expected_metrics={
        "rollout/reward_mean": (
            "scale: 0.20 for a random square 1-9, 0.49 for a random free square, 1.0 for "
            "perfect play; should rise over the first 100 steps as format failures (no tool "
            "call, occupied squares) disappear and wins and blocks are found"
        ),
        "rollout/accuracy": "share of optimal moves; rises with the reward",
        "rollout/response_length_mean": "short: one tool call, about 20-40 tokens",
    },
    gates=HEALTHY,
    description=(
        "Single-turn agentic RL: the tictactoe agent sends each position to the local "
        "OpenAI-compatible endpoint with the choose_square tool; the reward grades the move "
        "against a minimax player (1 optimal, 0.6 slower win, 0.3 draws a won game, 0.1 "
        "avoidable loss, 0 illegal). Use --agent-fn tictactoe-retry to give one retry after "
        "an illegal move (the retried move earns half)."
    ),
)

DUELGRID = Recipe(
    name="agentic/duelgrid",
    summary="DuelGrid grid duel over 2 rounds against a scripted opponent, via choose_action",
    algorithms=("gspo", "grpo"),
    dataset=DUELGRID_DATA,
    loader="duelgrid",
    reward="duelgrid",
    agent="duelgrid",
    checkpoint="Qwen/Qwen3-0.6B",
    defaults={
        **QWEN_COMMON,
        "batch_size": 16,
        "n_samples": 8,
        "mini_bs": 4,
        "max_new_tokens": 256,
        "max_prompt_tokens": 4096,
        "max_context_len": 4096,
        "epochs": 13,
        "max_steps": 200,
    },
    hardware=GPU,
    expected_metrics={
        "rollout/reward_mean": (
            "scale: 0.17 for doing nothing, 0.15 for random action lists, 0.46 for the "
            "scripted chase-and-attack policy; a learning run climbs past the do-nothing floor "
            "and toward the scripted policy as it stops wasting energy and walking into traps"
        ),
        "rollout/response_length_mean": "one choose_action call per turn, about 30-120 tokens",
    },
    gates=HEALTHY,
    description=(
        "Multi-turn agentic RL: the duelgrid agent plays row['turns'] rounds (2 in the "
        "shipped data); after each choose_action call it applies the actions with the rule "
        "engine, lets the scripted opponent reply and sends the outcome back as tool and user "
        "messages, which are masked from the loss. The reward replays the game and averages "
        "the per-turn scores."
    ),
)

TICTACTOE_CPU = Recipe(
    name="agentic/tictactoe-cpu",
    summary="Tic-tac-toe agentic smoke run: random tiny model, 2 steps on CPU",
    algorithms=("gspo", "grpo"),
    dataset=TICTACTOE_DATA,
    loader="tictactoe",
    reward="tictactoe",
    agent="tictactoe",
    checkpoint="random:qwen3-tiny",
    # the byte-level prompt with the tool schema is about 1,400 tokens
    defaults={**CPU_COMMON, "max_prompt_tokens": 2000},
    hardware=CPU,
    expected_metrics={
        "rollout/reward_mean": "about 0: a random model does not call tools",
        "train/loss": "finite",
    },
    gates=(*HEALTHY, *IN_RANGE),
    visibility="internal",
    description="Internal smoke test of the agentic path with the tictactoe agent.",
)

DUELGRID_CPU = Recipe(
    name="agentic/duelgrid-cpu",
    summary="DuelGrid agentic smoke run: random tiny model, 2 rounds, 2 steps on CPU",
    algorithms=("gspo", "grpo"),
    dataset=DUELGRID_DATA,
    loader="duelgrid",
    reward="duelgrid",
    agent="duelgrid",
    # the byte-level conversation reaches about 4,000 tokens after 2 rounds
    checkpoint="random:qwen3-tiny?max_position_embeddings=8192",
    defaults={**CPU_COMMON, "max_prompt_tokens": 6000, "max_context_len": 8000},
    hardware=CPU,
    expected_metrics={
        "rollout/reward_mean": "about 0: an unreadable reply scores 0",
        "train/loss": "finite",
    },
    gates=(*HEALTHY, *IN_RANGE),
    visibility="internal",
    description="Internal smoke test of the multi-turn agentic path with the duelgrid agent.",
)

RECIPES: tuple[Recipe, ...] = (TICTACTOE, DUELGRID, TICTACTOE_CPU, DUELGRID_CPU)

__all__ = ["DUELGRID", "DUELGRID_CPU", "RECIPES", "TICTACTOE", "TICTACTOE_CPU"]

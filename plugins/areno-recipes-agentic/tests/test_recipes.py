"""The pack's recipes: metadata, shipped datasets, reference rewards and CPU-sized limits."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from areno_recipes_agentic.duelgrid.agent import round_messages
from areno_recipes_agentic.duelgrid.episode import play_round, read_choice, score_episode
from areno_recipes_agentic.duelgrid.generate import generate_states
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader, read_state
from areno_recipes_agentic.duelgrid.policy import greedy_policy
from areno_recipes_agentic.duelgrid.rules import ACTION_TYPES, DIRECTIONS, GameState
from areno_recipes_agentic.recipes import (
    DUELGRID,
    DUELGRID_CPU,
    RECIPES,
    TICTACTOE,
    TICTACTOE_CPU,
    TICTACTOE_CPU_EVAL,
    TICTACTOE_CPU_SFT,
    TICTACTOE_CPU_SMOKE,
    TICTACTOE_MODEL,
    TICTACTOE_WARMSTART,
)
from areno_recipes_agentic.tictactoe.game import legal_moves
from areno_recipes_agentic.tictactoe.generate import generate_positions
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader
from areno_recipes_agentic.tictactoe.reward import score_move
from areno_recipes_agentic.toolcalls import AssistantTurn, message_turn

from areno_core.plugins import get_plugin_manager
from areno_core.recipe import resolve_resource
from areno_core.registry import Registry
from areno_core.resolve import resolve_run


def _rows(recipe_dataset: str) -> list[dict[str, Any]]:
    path = Path(resolve_resource(recipe_dataset))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_recipes_metadata_public_gpu_cpu_and_internal_smoke() -> None:
    for recipe in (TICTACTOE, DUELGRID):
        assert recipe.visibility == "public"
        assert recipe.checkpoint == "Qwen/Qwen3-0.6B"
        assert recipe.hardware.device == "cuda" and recipe.hardware.min_gpus == 1
        assert recipe.hardware.min_gpu_memory_gb == 24
        assert recipe.defaults["disable_thinking"] is True
        assert recipe.algorithms == ("gspo", "grpo")
    assert DUELGRID_CPU.visibility == "internal"
    assert DUELGRID_CPU.checkpoint is not None
    assert DUELGRID_CPU.checkpoint.startswith("random:qwen3-tiny")
    assert DUELGRID_CPU.defaults["max_steps"] == 2
    for recipe in (TICTACTOE_CPU, TICTACTOE_CPU_SMOKE):
        assert recipe.checkpoint == TICTACTOE_WARMSTART
        assert recipe.hardware.device == "cpu"
        assert recipe.algorithms[0] == "grpo"
        assert ("rises", "rollout/reward_mean") in {(g.kind, g.metric) for g in recipe.gates}
    assert TICTACTOE_CPU.visibility == "public" and TICTACTOE_CPU_SMOKE.visibility == "internal"
    assert TICTACTOE_CPU_SMOKE.defaults["max_steps"] < TICTACTOE_CPU.defaults["max_steps"]
    assert TICTACTOE_CPU_SFT.algorithms == ("sft",)
    assert TICTACTOE_CPU_SFT.checkpoint == TICTACTOE_MODEL
    for recipe in RECIPES:
        assert recipe.pack == "agentic"
        kinds = {(g.kind, g.metric) for g in recipe.gates}
        assert ("finite", "train/loss") in kinds
        assert any(kind == "checkpoint_loadable" for kind, _ in kinds)
        if recipe is not TICTACTOE_CPU_SFT:
            assert ("metric_exists", "rollout/reward_mean") in kinds or any(
                metric == "rollout/reward_mean" for _, metric in kinds
            )
            assert "rollout/reward_mean" in recipe.expected_metrics


def test_recipes_names_resolve_in_installed_registry() -> None:
    registry = Registry(get_plugin_manager())
    public = {r.name for r in registry.recipes()}
    assert {
        "agentic/tictactoe",
        "agentic/duelgrid",
        "agentic/tictactoe-cpu",
        "agentic/tictactoe-cpu-sft",
    } <= public
    assert not {"agentic/tictactoe-cpu-smoke", "agentic/duelgrid-cpu"} & public
    for recipe in RECIPES:
        assert registry.recipe(recipe.name) is recipe
        for algo in recipe.algorithms:
            options = recipe.options_for(algo)
            assert Path(options["dataset_path"]).is_file()
            registry.get("dataset_loaders", options["dataset_loader_fn"])
            if recipe.agent is not None:
                registry.get("rewards", options["reward_fn_path"])
                registry.get("agents", options["agent_fn"])
        resolved = resolve_run({"recipe": recipe.name}, registry=registry, check_capabilities=False)
        default = "gspo" if "gspo" in recipe.algorithms else recipe.algorithms[0]
        assert resolved.config.algo == default
        assert resolved.config.agent_fn == recipe.agent


def test_tictactoe_cpu_data_and_warm_start_match_their_commands() -> None:
    from areno_recipes_agentic.tictactoe.warmstart import sha256

    train = _rows(TICTACTOE_CPU.dataset or "")
    held_out = _rows(TICTACTOE_CPU_EVAL)
    assert held_out == generate_positions(500, 11, style="compact", tool_choice="choose_square")
    assert train == generate_positions(
        3015,
        12,
        style="compact",
        tool_choice="choose_square",
        exclude={r["board"] for r in held_out},
    )
    assert not {r["board"] for r in train} & {r["board"] for r in held_out}
    assert TICTACTOE_CPU_SFT.dataset == TICTACTOE_CPU.dataset
    warm = Path(resolve_resource(TICTACTOE_WARMSTART))
    provenance = json.loads((warm / "provenance.json").read_text())
    assert provenance["source_step"] == f"step_{TICTACTOE_CPU_SFT.defaults['max_steps']}"
    assert provenance["model_sha256"] == sha256(warm / "model.safetensors")
    assert "tools:" in (warm / "chat_template.jinja").read_text()  # the compact template


def test_recipe_datasets_match_documented_generator_commands() -> None:
    tictactoe = _rows(TICTACTOE.dataset or "")
    duelgrid = _rows(DUELGRID.dataset or "")
    assert tictactoe == generate_positions(256, 2026)
    assert duelgrid == generate_states(256, 2026, turns=2)
    for rows, loader in ((tictactoe, tictactoe_loader), (duelgrid[:64], duelgrid_loader)):
        for row in rows:
            assert loader(row)["tools"]
    for recipe in (TICTACTOE, DUELGRID):
        assert Path(resolve_resource(recipe.dataset)).stat().st_size < 256 * 1024


def test_recipe_reference_rewards_match_documented_scale() -> None:
    boards = [r["board"] for r in _rows(TICTACTOE.dataset or "")]
    free = statistics.mean(
        statistics.mean(score_move(b, m) for m in legal_moves(b)) for b in boards
    )
    any_square = statistics.mean(
        statistics.mean(score_move(b, m) for m in range(1, 10)) for b in boards
    )
    assert round(free, 2) == 0.49
    assert round(any_square, 2) == 0.20
    for text in ("0.20 for a random square 1-9", "0.49 for a random free square"):
        assert text in TICTACTOE.expected_metrics["rollout/reward_mean"]

    starts = [read_state(r["state"]) for r in _rows(DUELGRID.dataset or "")]
    rng = random.Random(0)

    def random_actions(state: GameState) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(ACTION_TYPES)
            if kind == "MOVE":
                out.append({"type": kind, "direction": rng.choice(list(DIRECTIONS))})
            else:
                out.append({"type": kind})
        return out

    def episode(start: GameState, policy: Any) -> float:
        state, turns = start, []
        for _ in range(2):
            actions = policy(state)
            turns.append(
                AssistantTurn(({"name": "choose_action", "arguments": {"actions": actions}},), "")
            )
            state = play_round(state, actions).after
            if state.is_over:
                break
        return score_episode(start, turns).total

    nothing = statistics.mean(episode(s, lambda s: []) for s in starts)
    scripted = statistics.mean(episode(s, lambda s: greedy_policy(s, "A")) for s in starts)
    randomly = statistics.mean(episode(s, random_actions) for s in starts for _ in range(2))
    assert round(nothing, 2) == 0.17
    assert round(scripted, 2) == 0.46
    assert randomly == pytest.approx(0.15, abs=0.03)
    text = DUELGRID.expected_metrics["rollout/reward_mean"]
    for fragment in ("0.17 for doing nothing", "0.15 for random", "0.46 for the scripted"):
        assert fragment in text


def test_cpu_recipes_prompts_fit_their_token_limits() -> None:
    from areno_core.models.loading import load_tokenizer

    tokenizer = load_tokenizer("random:qwen3-tiny")
    warm = load_tokenizer(str(resolve_resource(TICTACTOE_WARMSTART)))

    def length(messages: list[Any], tools: list[Any], tok: Any = tokenizer) -> int:
        text = tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        return len(tok.encode(text, add_special_tokens=False))

    limit = TICTACTOE_CPU.defaults["max_prompt_tokens"]
    longest = max(
        length(loaded["prompt"], loaded["tools"], warm)
        for loaded in map(tictactoe_loader, _rows(TICTACTOE_CPU.dataset or "")[:64])
    )
    # the forced call start (about 40 tokens) joins the prompt
    assert longest + 48 <= limit and 100 <= longest <= 130

    new_tokens = DUELGRID_CPU.defaults["max_new_tokens"]
    longest = 0
    for row in _rows(DUELGRID_CPU.dataset or "")[:32]:
        loaded = duelgrid_loader(row)
        state = read_state(loaded["state"])
        call = {
            "id": "c",
            "type": "function",
            "function": {"name": "choose_action", "arguments": '{"actions": []}'},
        }
        reply = {"role": "assistant", "content": "x" * new_tokens, "tool_calls": [call]}
        choice = read_choice(message_turn(reply))
        played = play_round(state, choice.actions or ())
        second = [
            *loaded["prompt"],
            reply,
            *round_messages(reply, choice, played, "tool", last=False),
        ]
        longest = max(longest, length(second, loaded["tools"]) + new_tokens)
    assert longest <= DUELGRID_CPU.defaults["max_prompt_tokens"]
    assert longest <= DUELGRID_CPU.defaults["max_context_len"] <= 8192

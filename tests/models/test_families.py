"""The model-family matrix: each family's tiny checkpoint on every path that runs in one process.

Each family is saved to a directory with the byte tokenizer and loaded back the way ``--ckpt
DIR`` loads it; then the native engine's log-probabilities must equal the training forward's
(padded with shared prompts, and packed), with windows shorter than the sequences so that
sliding windows really bind. Training end to end per family is in
tests/test_e2e_families.py; tensor-parallel refusals are here, plans in tests/train/distributed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from areno_core import log
from areno_core.errors import ConfigError
from areno_core.models.families import (
    FAMILIES,
    TINY_WINDOW,
    ModelFamily,
    attention_windows,
    available_families,
    family,
    has_sliding_window,
)
from areno_core.models.lean import lean_unavailable_reason
from areno_core.models.loading import load_model_and_tokenizer
from areno_core.models.lora import resolve_target_modules
from areno_core.rollout.cuda_graphs import DecodeGraphs
from areno_core.rollout.native import EngineOptions, NativeEngine
from areno_core.train.distributed.parallelize import TP_FAMILIES, check_tp_support
from areno_core.train.forward import policy_outputs
from areno_core.types import SamplingParams

NAMES = [f.name for f in available_families()]
WINDOWED = [f.name for f in available_families() if has_sliding_window(f.config())]
# Prompt lengths: the longest prompt plus its completion is 3x the window.
PROMPT_LENGTHS = (3, 11, 6)
NEW_TOKENS = 13
SAMPLINGS = {
    "t1": SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=7),
    "t07-topk-topp": SamplingParams(
        max_new_tokens=NEW_TOKENS, temperature=0.7, top_k=20, top_p=0.9, seed=3
    ),
    "greedy": SamplingParams(max_new_tokens=NEW_TOKENS, greedy=True),
}
TOLERANCE = 2e-5

pytestmark = pytest.mark.usefixtures("no_deprecated_transformers_api", "one_torch_thread")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: family(name).save(root / name) for name in NAMES}


@pytest.fixture(scope="module")
def loaded(checkpoints: dict[str, Path]) -> dict[str, tuple[torch.nn.Module, object]]:
    return {name: load_model_and_tokenizer(str(path)) for name, path in checkpoints.items()}


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(32, 250, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def rows_batch(completions: list) -> dict[str, torch.Tensor]:
    """Right-padded training rows of prompt + completion, the loss on the completion."""
    seqs = [list(c.prompt_ids) + list(c.token_ids) for c in completions]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss = torch.zeros(len(seqs), width)
    for i, (seq, c) in enumerate(zip(seqs, completions, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        loss[i, len(c.prompt_ids) : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss}


def training_logprobs(model: torch.nn.Module, batch: dict, temperature: float, packed: bool):
    with torch.no_grad():
        out = policy_outputs(model, batch, temperature=temperature, packed=packed)
    return out["logprobs"]


def rollout_vs_training_gap(model, tokenizer, sampling: SamplingParams, packed: bool) -> float:
    engine = NativeEngine(model, tokenizer, EngineOptions(attn_backend="native", max_running=4))
    groups = engine.generate(prompts(), sampling, n=2)
    completions = [c for group in groups for c in group]
    batch = rows_batch(completions)
    temperature = 1.0 if sampling.greedy else sampling.temperature
    expected = training_logprobs(model, batch, temperature, packed)
    gap = 0.0
    for i, c in enumerate(completions):
        start = len(c.prompt_ids)
        got = torch.tensor(c.logprobs)
        gap = max(gap, float((expected[i, start : start + len(got)] - got).abs().max()))
    return gap


@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
@pytest.mark.parametrize("name", NAMES)
def test_family_rollout_logprobs_match_padded_training_forward(loaded, name, sampling) -> None:
    model, tokenizer = loaded[name]
    gap = rollout_vs_training_gap(model, tokenizer, SAMPLINGS[sampling], packed=False)
    assert gap <= TOLERANCE, f"{name}: rollout and training log-probabilities differ by {gap}"


@pytest.mark.parametrize("name", NAMES)
def test_family_rollout_logprobs_match_packed_training_forward(loaded, name) -> None:
    model, tokenizer = loaded[name]
    gap = rollout_vs_training_gap(model, tokenizer, SAMPLINGS["t1"], packed=True)
    assert gap <= TOLERANCE, f"{name}: rollout and packed training differ by {gap}"


@pytest.mark.parametrize("name", WINDOWED)
def test_family_window_binds_on_the_test_sequences(loaded, checkpoints, name) -> None:
    """The same weights with a window longer than any test sequence score the test rollouts
    differently: the tests above really exercise the window."""
    model, tokenizer = loaded[name]
    engine = NativeEngine(model, tokenizer, EngineOptions(attn_backend="native"))
    groups = engine.generate(prompts(), SAMPLINGS["t1"], n=1)
    batch = rows_batch([g[0] for g in groups])
    assert batch["input_ids"].shape[1] > 2 * TINY_WINDOW
    unwindowed = AutoModelForCausalLM.from_pretrained(checkpoints[name], sliding_window=4096)
    windowed = training_logprobs(model, batch, 1.0, packed=False)
    full = training_logprobs(unwindowed.eval(), batch, 1.0, packed=False)
    assert float((windowed - full).abs().max()) > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_family_checkpoint_reloads_with_from_pretrained_to_the_same_logits(
    loaded, checkpoints, name
) -> None:
    model, tokenizer = loaded[name]
    again = AutoModelForCausalLM.from_pretrained(checkpoints[name]).eval()
    assert type(again).__name__ == family(name).causal_lm_cls
    ids = torch.tensor([tokenizer.encode("reload me, please")])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
    built = family(name).build(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(built(ids).logits, model(ids).logits, rtol=0, atol=0)


EXPECTED_LORA_TARGETS = {
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "qwen3_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gpt_oss": ["q_proj", "k_proj", "v_proj", "o_proj"],
}
ATTENTION_AND_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("name", NAMES)
def test_family_lora_defaults_to_its_attention_and_mlp_projections(loaded, name) -> None:
    model, _ = loaded[name]
    targets = resolve_target_modules(model, None)
    assert targets == EXPECTED_LORA_TARGETS.get(name, ATTENTION_AND_MLP)


@pytest.mark.parametrize("name", NAMES)
def test_family_tp_size_2_has_a_plan_or_a_refusal_naming_the_family(name) -> None:
    config = family(name).config()
    if config.model_type in TP_FAMILIES:
        check_tp_support(config, 2)
        return
    with pytest.raises(ConfigError, match=rf"--tp-size 2: --ckpt is a {config.model_type} model"):
        check_tp_support(config, 2)


def test_family_lean_forward_runs_exactly_the_llama_family() -> None:
    lean = {f.name for f in available_families() if lean_unavailable_reason(f.build()) is None}
    assert lean == {"llama", "qwen2", "qwen3"}


def test_attention_windows_read_layer_types_then_the_config_window() -> None:
    assert attention_windows(family("gemma3").config()) == [TINY_WINDOW, TINY_WINDOW, None]
    assert attention_windows(family("mistral").config()) == [TINY_WINDOW, TINY_WINDOW]
    assert attention_windows(family("llama").config()) == [None, None]


def test_attention_windows_unknown_layer_type_is_refused_by_name() -> None:
    config = family("gemma2").config()
    config.layer_types = ["sliding_attention", "linear_attention"]
    with pytest.raises(ConfigError, match="linear_attention"):
        attention_windows(config)


def test_unknown_family_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="known families: llama, qwen2"):
        family("falcon")


def test_every_family_names_real_classes_of_this_transformers() -> None:
    missing = {f.name for f in FAMILIES} - set(NAMES)
    # GPT-OSS came with transformers 4.55; every other family is older than areno's floor.
    assert missing <= {"gpt_oss"}
    assert all(isinstance(f, ModelFamily) for f in FAMILIES)


def test_family_outside_the_lean_pass_says_once_which_forward_runs_and_why(
    loaded, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(log, "_WARNED", set())
    model, tokenizer = loaded["gemma3"]
    engine = NativeEngine(model, tokenizer, EngineOptions(attn_backend="native"))
    with caplog.at_level(logging.INFO, logger="areno"):
        engine.generate(prompts(), SAMPLINGS["greedy"])
        batch = rows_batch([g[0] for g in engine.generate(prompts(), SAMPLINGS["greedy"])])
        training_logprobs(model, batch, 1.0, packed=True)
        training_logprobs(model, batch, 1.0, packed=True)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "native engine: Gemma3ForCausalLM decodes through its transformers forward (the lean "
        "forward pass does not run it: Gemma3ForCausalLM is not one of Qwen3ForCausalLM, "
        "Qwen2ForCausalLM, LlamaForCausalLM)",
        "--packed-forward: Gemma3ForCausalLM trains through its padded transformers forward "
        "(the packed forward does not run it: Gemma3ForCausalLM is not one of "
        "Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM)",
    ]


@pytest.mark.parametrize("name", ["gemma3", "mistral"])
def test_family_with_windows_never_takes_a_static_decode_step(loaded, name) -> None:
    """A static (CUDA-graph) step passes one mask to every layer, which would drop the
    windows: windowed models decode eagerly even with graphs installed."""
    model, tokenizer = loaded[name]
    eager = NativeEngine(model, tokenizer, EngineOptions(attn_backend="native"))
    static = NativeEngine(model, tokenizer, EngineOptions(attn_backend="native"))
    static._graphs = DecodeGraphs(capture=False, buckets=(1, 2, 4, 8))
    want = eager.generate(prompts(), SAMPLINGS["t1"], n=2)
    got = static.generate(prompts(), SAMPLINGS["t1"], n=2)
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in g] for g in want]
    assert static.stats["graph_decode_steps"] == 0

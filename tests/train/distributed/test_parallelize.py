"""Pieces of the sharding code that need no process group: plan checks, skeleton copies,
gradient clipping and weight copies on plain tensors."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, LlamaConfig, Qwen2Config

from areno_core.errors import ConfigError
from areno_core.models.scratch import build_random_config, build_random_model
from areno_core.train.distributed.parallelize import (
    check_tp_support,
    clip_sharded_grad_norm,
    copy_full_weights,
    decoder_layers,
)
from areno_core.train.dtensor import materialise, meta_copy


def test_tp_plan_families_with_divisible_heads_are_accepted():
    check_tp_support(build_random_config("random:qwen3-tiny"), 2)
    check_tp_support(LlamaConfig(num_attention_heads=8, num_key_value_heads=4), 4)
    check_tp_support(Qwen2Config(num_attention_heads=4, num_key_value_heads=2), 2)
    check_tp_support(GPT2Config(), 1)  # no split: any family


def test_tp_plan_unknown_family_is_a_clear_error():
    with pytest.raises(ConfigError) as info:
        check_tp_support(GPT2Config(), 2, what="--ckpt gpt2")
    assert str(info.value) == (
        "--tp-size 2: --ckpt gpt2 is a gpt2 model; tensor-parallel plans exist for qwen3, "
        "qwen2, llama, mistral, gemma2, gemma3_text. Use --tp-size 1 (data parallel only)"
    )


def test_tp_plan_heads_not_divisible_name_the_count():
    with pytest.raises(ConfigError, match="num_key_value_heads=2, which does not split into 4"):
        check_tp_support(build_random_config("random:qwen3-tiny"), 4)


def test_decoder_layers_of_a_causal_lm():
    model = build_random_model("random:qwen3-tiny")
    assert decoder_layers(model) == list(model.model.layers)
    with pytest.raises(ConfigError, match="Linear has no 'layers' list"):
        decoder_layers(torch.nn.Linear(2, 2))


def test_meta_copy_costs_no_parameter_memory_and_materialise_keeps_ties_and_buffers():
    model = build_random_model("random:qwen3-tiny")
    skeleton = meta_copy(model)
    assert all(p.is_meta for p in skeleton.parameters())
    assert skeleton.lm_head.weight is skeleton.model.embed_tokens.weight
    rotary = dict(model.named_buffers())
    assert rotary and all(not b.is_meta for b in skeleton.buffers())
    weights = model.state_dict()
    copy = materialise(skeleton, "cpu", weights)
    assert copy.lm_head.weight is copy.model.embed_tokens.weight
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(copy(ids).logits, model(ids).logits, rtol=0, atol=0)
    with pytest.raises(KeyError, match="no weight for"):
        materialise(skeleton, "cpu", {})


def test_copy_full_weights_between_plain_modules():
    source = build_random_model("random:qwen3-tiny?seed=1")
    target = materialise(meta_copy(source), "cpu")
    copy_full_weights(source, target)
    want, got = source.state_dict(), target.state_dict()
    assert list(want) == list(got)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)


def test_clip_sharded_grad_norm_on_plain_tensors_matches_torch():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for p, q in zip(ours, theirs, strict=True):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    norm = clip_sharded_grad_norm(ours, 0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    torch.testing.assert_close(norm, expected)
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)


def test_tp_plan_of_lora_projections_splits_the_base_and_the_matching_adapter_half():
    pytest.importorskip("peft", reason="LoRA needs peft")
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from areno_core.models.lora import LoraAdapter, LoraSettings
    from areno_core.train.distributed.parallelize import _linear_plan

    policy = build_random_model("random:qwen3-tiny")
    LoraAdapter.attach(policy, LoraSettings(rank=2, target_modules=("q_proj", "o_proj")))
    layer = dict(decoder_layers(policy)[0].named_modules())

    def plan(name: str, style: type, *, column: bool) -> dict[str, type]:
        return {
            k: type(v) for k, v in _linear_plan(name, layer[name], style, column=column).items()
        }

    # Column parallel: the base and lora_B split by output features, lora_A whole.
    assert plan("self_attn.q_proj", ColwiseParallel, column=True) == {
        "self_attn.q_proj.base_layer": ColwiseParallel,
        "self_attn.q_proj.lora_B.default": ColwiseParallel,
    }
    # Row parallel: the base and lora_A split by input features, lora_B whole.
    assert plan("self_attn.o_proj", RowwiseParallel, column=False) == {
        "self_attn.o_proj.base_layer": RowwiseParallel,
        "self_attn.o_proj.lora_A.default": RowwiseParallel,
    }
    # A projection without an adapter keeps the plain plan.
    assert plan("self_attn.k_proj", ColwiseParallel, column=True) == {
        "self_attn.k_proj": ColwiseParallel
    }

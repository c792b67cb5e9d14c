"""The lean shared-prompt training forward gives the transformers module's numbers, bit for bit
in float32: outputs and the gradients that flow back from them."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import areno_core.train.forward as forward
import areno_core.train.lean_prefix as lean_prefix
from areno_core.models.loading import enable_activation_checkpointing
from areno_core.models.scratch import build_random_model
from areno_core.train.batching import collate
from areno_core.train.forward import policy_outputs
from areno_core.train.lean_prefix import causal_padding_mask, lean_prefix_reason
from areno_core.types import Trajectory


def group_rows(prompts: list[list[int]], completions: list[list[list[int]]]) -> list[Trajectory]:
    return [
        Trajectory(
            input_ids=[*prompt, *completion],
            loss_mask=[0] * len(prompt) + [1] * len(completion),
            rollout_logprobs=[0.0] * (len(prompt) + len(completion)),
            prompt_len=len(prompt),
            prompt_index=g,
        )
        for g, (prompt, samples) in enumerate(zip(prompts, completions, strict=True))
        for completion in samples
    ]


def batch_of(prompt_lengths: list[int], completion_lengths: list[int]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(len(prompt_lengths) * 7 + sum(completion_lengths))

    def tokens(n: int) -> list[int]:
        return torch.randint(0, 250, (n,), generator=gen).tolist()

    prompts = [tokens(n) for n in prompt_lengths]
    completions = [[tokens(n) for n in completion_lengths] for _ in prompts]
    return collate(group_rows(prompts, completions), pad_id=0)


def outputs_and_grads(model, batch, *, lean: bool, monkeypatch):
    monkeypatch.setattr(
        forward, "lean_prefix_reason", lean_prefix_reason if lean else lambda model: "off"
    )
    model.zero_grad(set_to_none=True)
    out = policy_outputs(model, batch, need_entropy=True, share_prefix=True)
    weights = torch.linspace(-1.0, 1.0, batch["loss_mask"].numel()).view_as(batch["loss_mask"])
    (out["logprobs"] * batch["loss_mask"] * weights).sum().backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    ("prompt_lengths", "completion_lengths"),
    [
        ([9, 6, 7], [5, 8, 3, 8]),  # padded prompts and completions: both calls masked
        ([6, 6], [4, 4, 4]),  # no padding at all: the prompts run causally without a mask
        ([9, 6, 7], [1, 1, 1]),  # one-token completions: a single query per row
        ([5, 5], [1, 1]),  # ... without padding: the continued rows' mask is dropped too
    ],
)
def test_lean_prefix_equals_the_module_bit_for_bit(prompt_lengths, completion_lengths, monkeypatch):
    model = build_random_model("random:qwen3-tiny")
    model.train()
    assert lean_prefix_reason(model) is None
    batch = batch_of(prompt_lengths, completion_lengths)
    assert forward.shared_prefix_plan(batch) is not None
    module_out, module_grads = outputs_and_grads(model, batch, lean=False, monkeypatch=monkeypatch)
    lean_out, lean_grads = outputs_and_grads(model, batch, lean=True, monkeypatch=monkeypatch)
    assert module_out.keys() == lean_out.keys() == {"logprobs", "entropy"}
    for key in module_out:
        assert torch.equal(lean_out[key], module_out[key]), key
    assert module_grads.keys() == lean_grads.keys()
    for name, grad in module_grads.items():
        assert torch.equal(lean_grads[name], grad), name


def test_lean_prefix_is_refused_where_the_module_numbers_would_differ():
    model = build_random_model("random:qwen3-tiny")
    model.config.attention_dropout = 0.1
    model.train()
    assert lean_prefix_reason(model) == "attention dropout is on"
    model.eval()  # dropout is off outside training
    assert lean_prefix_reason(model) is None
    model.config._attn_implementation = "eager"
    assert "not 'sdpa'" in str(lean_prefix_reason(model))


def test_lean_prefix_is_not_used_with_activation_checkpointing():
    # Checkpointing turns the module's cache off, so prompts are not shared at all then.
    model = build_random_model("random:qwen3-tiny")
    enable_activation_checkpointing(model)
    model.train()
    batch = batch_of([9, 6], [3, 5])
    assert not forward.supports_shared_prefix(model)
    out = policy_outputs(model, batch, share_prefix=True)
    assert out["logprobs"].shape == batch["input_ids"].shape


def test_causal_padding_mask_by_hand():
    valid = torch.tensor([[True, True, False, True, True], [True, True, True, True, True]])
    mask = causal_padding_mask(valid, q_length=2, q_offset=3)
    assert mask.shape == (2, 1, 2, 5)
    # Query 0 sits at column 3 (sees columns 0..3), query 1 at column 4 (sees 0..4).
    assert mask[0, 0].tolist() == [
        [True, True, False, True, False],
        [True, True, False, True, True],
    ]
    assert mask[1, 0].tolist() == [[True, True, True, True, False], [True] * 5]


def test_the_cached_lean_pass_does_not_keep_its_model_alive():
    model = build_random_model("random:qwen3-tiny")
    model.train()
    policy_outputs(model, batch_of([6, 5], [2, 3]), share_prefix=True)
    assert model in lean_prefix._DECODERS  # the lean pass ran and was cached
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None

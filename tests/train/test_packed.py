"""The lean packed training forward: layouts by hand, and the padded forward's numbers."""

from __future__ import annotations

import pytest
import torch

from areno_core.models.scratch import build_random_model
from areno_core.train.forward import packed_outputs, policy_outputs, shared_prefix_plan
from areno_core.train.lean_prefix import lean_prefix_reason
from areno_core.train.packed import build_layout, packed_unavailable_reason

from .test_shared_prefix import grouped_batch

TOL = {"atol": 2e-5, "rtol": 2e-5}


@pytest.fixture(scope="module")
def model():
    return build_random_model("random:qwen3-tiny")


def _sft_batch(vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths, prompts = (9, 4, 13, 6), (3, 2, 5, 2)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss = torch.zeros(len(lengths), width)
    for row, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        ids[row, :n] = torch.randint(1, vocab, (n,), generator=gen)
        mask[row, :n] = 1
        loss[row, p:n] = 1.0
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss}


def test_build_layout_without_plan_packs_real_tokens_row_by_row():
    batch = {
        "input_ids": torch.tensor([[10, 11, 12], [20, 21, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "loss_mask": torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),
    }
    layout = build_layout(batch)
    assert layout.tokens.tolist() == [10, 11, 12, 20, 21]
    assert layout.positions.tolist() == [0, 1, 2, 0, 1]
    assert layout.score_src.tolist() == [0, 1, 3]  # the positions that predict each target
    assert layout.score_target.tolist() == [11, 12, 21]
    assert list(zip(layout.score_row.tolist(), layout.score_col.tolist(), strict=True)) == [
        (0, 1),
        (0, 2),
        (1, 1),
    ]
    assert layout.child_valid is None


def test_build_layout_with_shared_prompt_keeps_one_copy_of_it():
    batch = {
        "input_ids": torch.tensor([[7, 8, 1, 2], [7, 8, 3, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        "loss_mask": torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]]),
    }
    plan = shared_prefix_plan(batch, min_saving=0.0)
    assert plan is not None and plan.prefix_len.tolist() == [2]
    layout = build_layout(batch, plan)
    assert layout.tokens.tolist() == [7, 8, 1, 2, 3]  # the prompt once, then each remainder
    assert layout.positions.tolist() == [0, 1, 2, 3, 2]
    assert layout.score_src.tolist() == [1, 2, 1]  # both rows' first answer token: from "8"
    assert layout.score_target.tolist() == [1, 2, 3]
    assert layout.child_parent.tolist() == [0, 0]


def _grads(model, fn, mask) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logprobs = fn()["logprobs"]
    loss = -(logprobs * mask).sum() / mask.sum()  # the SFT loss: mean NLL of the loss tokens
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.detach(), logprobs.detach(), grads


@pytest.mark.parametrize("shape", ["sft", "grpo"])
def test_packed_forward_gives_padded_losses_logprobs_and_gradients(model, shape):
    model.train()
    batch = _sft_batch(model.config.vocab_size) if shape == "sft" else grouped_batch()
    mask = batch["loss_mask"]
    assert packed_unavailable_reason(model) is None
    padded = _grads(model, lambda: policy_outputs(model, batch, share_prefix=False), mask)
    packed = _grads(model, lambda: policy_outputs(model, batch, packed=True), mask)
    torch.testing.assert_close(packed[0], padded[0], **TOL)
    scored = mask > 0
    torch.testing.assert_close(packed[1][scored], padded[1][scored], **TOL)
    assert bool((packed[1][~scored] == 0).all())
    for a, b in zip(packed[2], padded[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_packed_forward_entropy_matches_padded(model):
    batch = grouped_batch()
    scored = batch["loss_mask"] > 0
    with torch.no_grad():
        padded = policy_outputs(model, batch, share_prefix=False, need_entropy=True)
        packed = policy_outputs(model, batch, packed=True, need_entropy=True, temperature=0.7)
        padded_t = policy_outputs(
            model, batch, share_prefix=False, need_entropy=True, temperature=0.7
        )
    assert not torch.allclose(padded["entropy"][scored], padded_t["entropy"][scored])
    torch.testing.assert_close(packed["entropy"][scored], padded_t["entropy"][scored], **TOL)
    torch.testing.assert_close(packed["logprobs"][scored], padded_t["logprobs"][scored], **TOL)


def test_packed_forward_falls_back_to_the_module_when_hooks_are_registered(model):
    calls = []
    batch = _sft_batch(model.config.vocab_size)
    valid = batch["attention_mask"].bool()
    valid[:, 0] = False
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        assert "forward hooks" in (packed_unavailable_reason(model) or "")
        with torch.no_grad():
            policy_outputs(model, batch, packed=True)
            assert len(calls) == 1  # the transformers module ran, on the padded rows
            flat = packed_outputs(model, batch)  # block-diagonal rows through the module
            assert len(calls) == 2
            padded = policy_outputs(model, batch, share_prefix=False)
    finally:
        handle.remove()
    torch.testing.assert_close(flat["logprobs"][valid], padded["logprobs"][valid], **TOL)


def test_packed_check_is_remembered_until_a_hook_or_the_parameters_change(monkeypatch):
    from areno_core.models import lean

    model = build_random_model("random:qwen3-tiny")
    walks = []
    real = lean.lean_unavailable_reason
    monkeypatch.setattr(
        lean, "lean_unavailable_reason", lambda m, **kw: walks.append(1) or real(m, **kw)
    )
    assert packed_unavailable_reason(model) is None
    assert packed_unavailable_reason(model) is None
    assert len(walks) == 1  # remembered
    # A hook on a submodule, registered after the walk, is seen.
    handle = model.model.layers[1].mlp.register_forward_pre_hook(lambda *a: None)
    try:
        assert "layers.1.mlp has forward hooks" in (packed_unavailable_reason(model) or "")
        assert len(walks) == 2
    finally:
        handle.remove()
    # So is a global module hook.
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert packed_unavailable_reason(model) == "global module hooks are registered"
        assert len(walks) == 3
    finally:
        handle.remove()
    # New parameters (a move to another dtype) are walked again.
    model.to(torch.float64)
    assert packed_unavailable_reason(model) is None and len(walks) == 4
    # The padded shared-prompt forward asks with SDPA required: its own answer, walked once.
    assert lean_prefix_reason(model) is None and lean_prefix_reason(model) is None
    assert len(walks) == 5


def test_packed_forward_in_bfloat16_stays_close_to_float32(model):
    low = build_random_model("random:qwen3-tiny").to(torch.bfloat16)
    low.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    batch = _sft_batch(model.config.vocab_size)
    scored = batch["loss_mask"] > 0
    with torch.no_grad():
        got = policy_outputs(low, batch, packed=True)["logprobs"]
        want = policy_outputs(model, batch, share_prefix=False)["logprobs"]
    assert got.dtype == torch.float32  # log-softmax in float32 whatever the weights
    # Mean NLL within 1% (bfloat16 keeps ~3 significant digits per product).
    torch.testing.assert_close(got[scored].mean(), want[scored].mean(), atol=0, rtol=1e-2)
    torch.testing.assert_close(got[scored], want[scored], atol=5e-2, rtol=2e-2)


def test_packed_forward_with_activation_checkpointing_checkpoints_each_layer_and_keeps_gradients(
    monkeypatch,
):
    """With the module's activation checkpointing on, the packed path still runs (prompts
    stay shared) and checkpoints every decoder layer itself, with the same numbers."""
    import areno_core.train.packed as packed_module
    from areno_core.models.loading import enable_activation_checkpointing

    model = build_random_model("random:qwen3-tiny")
    model.train()
    batch = grouped_batch()
    mask = batch["loss_mask"]
    plain = _grads(model, lambda: policy_outputs(model, batch, packed=True), mask)

    enable_activation_checkpointing(model)
    assert packed_unavailable_reason(model) is None
    calls = []
    real = packed_module.checkpoint

    def counting(*args, **kwargs):
        calls.append(kwargs.get("use_reentrant"))
        return real(*args, **kwargs)

    monkeypatch.setattr(packed_module, "checkpoint", counting)
    checkpointed = _grads(model, lambda: policy_outputs(model, batch, packed=True), mask)
    assert calls == [False] * model.config.num_hidden_layers
    torch.testing.assert_close(checkpointed[0], plain[0], atol=0.0, rtol=0.0)
    for a, b in zip(checkpointed[2], plain[2], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    calls.clear()
    with torch.no_grad():  # nothing to recompute without gradients
        policy_outputs(model, batch, packed=True)
    assert calls == []


def test_padded_forward_with_activation_checkpointing_hints_at_packed_forward_once(
    monkeypatch, caplog
):
    import logging

    from areno_core import log
    from areno_core.models.loading import enable_activation_checkpointing

    monkeypatch.setattr(log, "_WARNED", set())
    model = build_random_model("random:qwen3-tiny")
    model.train()
    batch = grouped_batch()
    with caplog.at_level(logging.WARNING, logger="areno"):
        policy_outputs(model, batch)  # checkpointing off: prompts shared, nothing to say
        assert "--packed-forward" not in caplog.text
        enable_activation_checkpointing(model)
        policy_outputs(model, batch)
        policy_outputs(model, batch, packed=True)  # the packed path shares: no hint
        policy_outputs(model, batch)
    assert caplog.text.count("--packed-forward shares prompts with checkpointing on") == 1

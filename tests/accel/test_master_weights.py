"""Float32 master weights for bfloat16 models: updates as exact as float32 training."""

from __future__ import annotations

import pytest
import torch

from areno_core.accel.master_weights import MasterWeightOptimizer, needs_master_weights
from areno_core.model import TrainableModel
from areno_core.models.scratch import build_random_model
from areno_core.models.tokenizer import build_byte_tokenizer
from areno_core.train.optim import (
    build_optimizer,
    build_scheduler,
    clip_grad_norm,
    gradient_tensors,
)

SETTINGS = {"lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.01, "adam_8bit": False}


def _pair(seed: int = 0) -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
    """A bfloat16 matrix and a float32 copy of its (rounded) values."""
    gen = torch.Generator().manual_seed(seed)
    low = torch.nn.Parameter((torch.randn(6, 5, generator=gen) * 0.02).to(torch.bfloat16))
    return low, torch.nn.Parameter(low.detach().float().clone())


def _grads(steps: int, micro: int) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    # bfloat16-representable gradients, so both sides see exactly the same numbers.
    return [
        [torch.randn(6, 5, generator=gen).to(torch.bfloat16).float() for _ in range(micro)]
        for _ in range(steps)
    ]


def test_needs_master_weights_only_for_trainable_low_precision_params():
    low, full = _pair()
    frozen = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16), requires_grad=False)
    assert needs_master_weights([low]) and needs_master_weights([full, low])
    assert not needs_master_weights([full]) and not needs_master_weights([full, frozen])
    assert isinstance(build_optimizer([low], **SETTINGS), MasterWeightOptimizer)
    assert type(build_optimizer([full], **SETTINGS)) is torch.optim.AdamW


def test_masters_follow_float32_adamw_exactly_with_accumulation_clipping_and_schedule():
    low, full = _pair()
    opt_low = build_optimizer([low], **SETTINGS)
    opt_full = build_optimizer([full], **SETTINGS)
    sched_low = build_scheduler(opt_low, lr=1e-3, min_lr=1e-4, decay_steps=5, style="cosine")
    sched_full = build_scheduler(opt_full, lr=1e-3, min_lr=1e-4, decay_steps=5, style="cosine")
    for micro_grads in _grads(steps=4, micro=3):
        for g in micro_grads:  # three microbatches per optimizer step
            (low * g.to(torch.bfloat16)).sum().backward()
            (full * g).sum().backward()
        assert low.grad is None  # moved into the master's float32 gradient at once
        norm_low = clip_grad_norm(gradient_tensors(opt_low, [low]), 0.5)
        norm_full = clip_grad_norm(gradient_tensors(opt_full, [full]), 0.5)
        torch.testing.assert_close(norm_low, norm_full, atol=0.0, rtol=0.0)
        for opt, sched in ((opt_low, sched_low), (opt_full, sched_full)):
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
    master = opt_low.masters[0]
    assert master.dtype == torch.float32
    torch.testing.assert_close(master, full.detach(), atol=0.0, rtol=0.0)
    torch.testing.assert_close(low.detach(), full.detach().to(torch.bfloat16), atol=0.0, rtol=0.0)
    assert opt_low.param_groups[0]["lr"] == opt_full.param_groups[0]["lr"]


def test_small_updates_survive_in_masters_but_vanish_in_plain_bfloat16_adamw():
    low, _ = _pair()
    plain = torch.nn.Parameter(low.detach().clone())
    start = low.detach().float().clone()
    opt_master = build_optimizer([low], **{**SETTINGS, "lr": 1e-6, "weight_decay": 0.0})
    opt_plain = torch.optim.AdamW([plain], lr=1e-6, weight_decay=0.0)
    for _ in range(20):
        for p, opt in ((low, opt_master), (plain, opt_plain)):
            p.sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert torch.equal(plain.detach().float(), start)  # every update rounded away
    moved = (start - opt_master.masters[0]).abs()
    torch.testing.assert_close(moved, torch.full_like(moved, 20e-6), atol=1e-7, rtol=0.0)


def test_state_dict_round_trip_restores_masters_exactly():
    low, _ = _pair()
    opt = build_optimizer([low], **SETTINGS)
    for g in _grads(steps=3, micro=1):
        (low * g[0].to(torch.bfloat16)).sum().backward()
        opt.step()
        opt.zero_grad()
    state = opt.state_dict()
    assert "master_weights" in state and state["master_weights"][0].dtype == torch.float32
    other, _ = _pair(seed=5)
    restored = build_optimizer([other], **SETTINGS)
    restored.load_state_dict(state)
    torch.testing.assert_close(restored.masters[0], opt.masters[0], atol=0.0, rtol=0.0)
    torch.testing.assert_close(other.detach(), low.detach(), atol=0.0, rtol=0.0)
    assert restored.state[restored.masters[0]]["exp_avg"].dtype == torch.float32


def test_state_dict_of_a_float32_run_takes_masters_from_the_weights():
    low, full = _pair()
    opt_full = build_optimizer([full], **SETTINGS)
    full.sum().backward()
    opt_full.step()
    low.data.copy_(full.detach())  # the weights a float32 checkpoint would load, rounded
    opt_low = build_optimizer([low], **SETTINGS)
    opt_low.load_state_dict(opt_full.state_dict())
    torch.testing.assert_close(opt_low.masters[0], low.detach().float(), atol=0.0, rtol=0.0)


def test_state_dict_with_wrong_master_count_is_refused():
    low, _ = _pair()
    opt = build_optimizer([low], **SETTINGS)
    state = opt.state_dict()
    state["master_weights"] = []
    with pytest.raises(ValueError, match="holds 0 master weights, the model has 1"):
        opt.load_state_dict(state)


def test_bfloat16_policy_trains_with_grpo_through_local_backend(tmp_path):
    from areno_core.backend import LocalBackend
    from areno_core.tune.probes import synthetic_groups

    policy = build_random_model("random:qwen3-tiny", dtype=torch.bfloat16)
    model = TrainableModel(policy, build_byte_tokenizer())
    backend = LocalBackend(device="cpu")
    groups = synthetic_groups(8, n_samples=4, prompt_tokens=6, total_tokens=14, vocab=200)
    before = [p.detach().clone() for p in policy.parameters()]
    result = backend.train(
        model, groups, algorithm="grpo", learning_rate=1e-2, mini_bs=4, grad_clip_norm=1.0
    )
    assert isinstance(model.optimizer, MasterWeightOptimizer)
    assert result.metrics["train/grad_norm"] > 0  # clipping saw the float32 gradients
    assert all(p.dtype == torch.bfloat16 for p in policy.parameters())
    assert any(
        not torch.equal(a, p.detach()) for a, p in zip(before, policy.parameters(), strict=True)
    )
    path = backend.save_checkpoint(model, tmp_path, trainer_state={"data": {}}, config={})
    fresh = TrainableModel(
        build_random_model("random:qwen3-tiny?seed=9", dtype=torch.bfloat16),
        build_byte_tokenizer(),
    )
    backend.setup(fresh, backend.algorithm("grpo"), learning_rate=1e-2)
    backend.load_checkpoint(fresh, path)
    for a, b in zip(fresh.optimizer.masters, model.optimizer.masters, strict=True):
        torch.testing.assert_close(a, b, atol=0.0, rtol=0.0)

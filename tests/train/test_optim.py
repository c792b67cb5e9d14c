"""Optimizer construction, LR schedules on hand-computed values, gradient clipping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from areno_core.errors import ConfigError, NotAvailableError
from areno_core.train import optim
from areno_core.train.optim import (
    build_optimizer,
    build_scheduler,
    check_adam_8bit_available,
    clip_grad_norm,
)


def _lrs(style: str, steps: int, *, warmup_steps: int = 0) -> list[float]:
    """LR in effect for optimizer steps 0..steps-1 with lr=2.0, min_lr=0.2, decay over 4."""
    param = nn.Parameter(torch.zeros(2, 2))
    opt = build_optimizer([param], lr=2.0, betas=(0.9, 0.999), weight_decay=0.0, adam_8bit=False)
    sched = build_scheduler(
        opt, lr=2.0, min_lr=0.2, decay_steps=4, style=style, warmup_steps=warmup_steps
    )
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        param.grad = torch.ones_like(param)
        opt.step()
        sched.step()
    return out


def test_build_optimizer_mixed_params_no_decay_on_vectors() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    opt = build_optimizer(
        model.parameters(), lr=1e-3, betas=(0.8, 0.95), weight_decay=0.1, adam_8bit=False
    )
    assert isinstance(opt, torch.optim.AdamW)
    decayed, undecayed = opt.param_groups
    assert decayed["weight_decay"] == 0.1
    assert [p.shape for p in decayed["params"]] == [torch.Size([4, 3])]
    assert undecayed["weight_decay"] == 0.0
    assert [p.shape for p in undecayed["params"]] == [torch.Size([4])] * 3
    assert decayed["betas"] == (0.8, 0.95)
    assert decayed["fused"] is True  # float32 on CPU supports the fused kernel


def test_build_optimizer_frozen_params_left_out() -> None:
    frozen = nn.Parameter(torch.zeros(3, 3), requires_grad=False)
    trained = nn.Parameter(torch.zeros(3, 3))
    opt = build_optimizer(
        [frozen, trained], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1, adam_8bit=False
    )
    assert len(opt.param_groups) == 1
    assert opt.param_groups[0]["params"] == [trained]


def test_build_optimizer_no_trainable_params_raises() -> None:
    frozen = nn.Parameter(torch.zeros(3), requires_grad=False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer([frozen], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, adam_8bit=False)


def test_adam_8bit_without_bitsandbytes_or_gpu_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optim.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(optim.torch.cuda, "is_available", lambda: False)
    with pytest.raises(NotAvailableError, match="bitsandbytes package .* and a CUDA GPU"):
        check_adam_8bit_available()
    with pytest.raises(NotAvailableError, match="--adam-8bit needs"):
        build_optimizer(
            [nn.Parameter(torch.zeros(2, 2))],
            lr=1e-3,
            betas=(0.9, 0.999),
            weight_decay=0.0,
            adam_8bit=True,
        )


def test_adam_8bit_with_package_but_no_gpu_names_only_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optim.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(optim.torch.cuda, "is_available", lambda: False)
    with pytest.raises(NotAvailableError) as info:
        check_adam_8bit_available()
    assert str(info.value) == "--adam-8bit needs a CUDA GPU (none is visible to torch)"


def test_adam_8bit_with_gpu_but_no_package_names_only_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(optim.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(optim.torch.cuda, "is_available", lambda: True)
    with pytest.raises(NotAvailableError) as info:
        check_adam_8bit_available()
    assert "bitsandbytes" in str(info.value)
    assert "CUDA" not in str(info.value)


def test_scheduler_cosine_hand_values_decay_then_hold() -> None:
    lrs = _lrs("cosine", 7)
    # min + (max - min) * 0.5 * (1 + cos(pi * t)), t = step / 4
    expected = [2.0, 0.2 + 0.9 * (1 + math.cos(math.pi / 4)), 1.1, 0.2 + 0.9 * (1 - math.sqrt(0.5))]
    expected += [0.2, 0.2, 0.2]
    torch.testing.assert_close(lrs, expected, rtol=0.0, atol=1e-12)


def test_scheduler_linear_hand_values_decay_then_hold() -> None:
    lrs = _lrs("linear", 7)
    torch.testing.assert_close(lrs, [2.0, 1.55, 1.1, 0.65, 0.2, 0.2, 0.2], rtol=0.0, atol=1e-12)


def test_scheduler_constant_holds_lr() -> None:
    lrs = _lrs("constant", 6)
    torch.testing.assert_close(lrs, [2.0] * 6, rtol=0.0, atol=0.0)


def test_scheduler_warmup_ramps_then_decays_over_decay_steps() -> None:
    lrs = _lrs("linear", 8, warmup_steps=2)
    # warm-up: 2 * (step + 1) / 2; then linear decay over steps 2..6, then hold
    expected = [1.0, 2.0, 2.0, 1.55, 1.1, 0.65, 0.2, 0.2]
    torch.testing.assert_close(lrs, expected, rtol=0.0, atol=1e-12)


def test_scheduler_state_dict_round_trip_continues_schedule() -> None:
    param = nn.Parameter(torch.zeros(2, 2))
    opt = build_optimizer([param], lr=2.0, betas=(0.9, 0.999), weight_decay=0.0, adam_8bit=False)
    sched = build_scheduler(opt, lr=2.0, min_lr=0.2, decay_steps=4, style="linear")
    for _ in range(2):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = build_optimizer([param], lr=2.0, betas=(0.9, 0.999), weight_decay=0.0, adam_8bit=False)
    sched2 = build_scheduler(opt2, lr=2.0, min_lr=0.2, decay_steps=4, style="linear")
    sched2.load_state_dict(state)
    opt2.step()
    sched2.step()
    torch.testing.assert_close(sched2.get_last_lr(), [0.65], rtol=0.0, atol=1e-12)


@pytest.mark.parametrize(
    ("min_lr", "style", "error"),
    [(0.0, "step", "cosine, linear, constant"), (2.0, "cosine", "--min-lr")],
    ids=["unknown-style", "min-lr-above-lr"],
)
def test_build_scheduler_bad_settings_raise_config_error(
    min_lr: float, style: str, error: str
) -> None:
    opt = build_optimizer(
        [nn.Parameter(torch.zeros(2, 2))],
        lr=1.0,
        betas=(0.9, 0.999),
        weight_decay=0.0,
        adam_8bit=False,
    )
    with pytest.raises(ConfigError, match=error):
        build_scheduler(opt, lr=1.0, min_lr=min_lr, decay_steps=4, style=style)


def test_clip_grad_norm_large_grads_returns_preclip_norm_and_scales() -> None:
    a = nn.Parameter(torch.zeros(2))
    b = nn.Parameter(torch.zeros(1))
    no_grad = nn.Parameter(torch.zeros(3))
    a.grad = torch.tensor([3.0, 0.0])
    b.grad = torch.tensor([4.0])
    norm = clip_grad_norm([a, b, no_grad], max_norm=1.0)
    torch.testing.assert_close(norm, torch.tensor(5.0), rtol=0.0, atol=1e-6)
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0]), rtol=0.0, atol=1e-6)
    torch.testing.assert_close(b.grad, torch.tensor([0.8]), rtol=0.0, atol=1e-6)
    assert no_grad.grad is None


def test_clip_grad_norm_small_grads_unchanged() -> None:
    a = nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([0.3, 0.4])
    norm = clip_grad_norm([a], max_norm=1.0)
    torch.testing.assert_close(norm, torch.tensor(0.5), rtol=0.0, atol=1e-7)
    torch.testing.assert_close(a.grad, torch.tensor([0.3, 0.4]), rtol=0.0, atol=0.0)

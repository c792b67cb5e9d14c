"""The lean forward pass: hand-computed pieces, and the same logits as the transformers module."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from areno_core.contracts.engine import EngineOptions, RolloutSession
from areno_core.errors import NotAvailableError
from areno_core.models.lean import (
    LeanDecoder,
    apply_rotary,
    lean_unavailable_reason,
    prepack_unavailable_reason,
    rms_norm,
)
from areno_core.models.scratch import build_random_model
from areno_core.rollout.native import PREPACK_MIN_NEW_TOKENS, NativeEngine, NativeEngineConfig
from areno_core.types import SamplingParams


@pytest.fixture(scope="module")
def model():
    return build_random_model("random:qwen3-tiny").eval()


def _no_cache(index: int, keys: torch.Tensor, values: torch.Tensor):
    return keys, values


def test_rms_norm_matches_hand_computed_values():
    x = torch.tensor([[3.0, 4.0]])
    out = rms_norm(x, torch.tensor([1.0, 2.0]), eps=0.0)
    rms = math.sqrt((9 + 16) / 2)
    torch.testing.assert_close(out, torch.tensor([[3 / rms, 8 / rms]]), atol=1e-6, rtol=0)


def test_apply_rotary_quarter_turn_rotates_halves():
    q = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4)
    cos, sin = torch.zeros(1, 1, 4), torch.ones(1, 1, 4)
    rq, rk = apply_rotary(q, q.clone(), cos, sin)
    expected = torch.tensor([-3.0, -4.0, 1.0, 2.0]).view(1, 1, 1, 4)
    torch.testing.assert_close(rq, expected, atol=0, rtol=0)
    torch.testing.assert_close(rk, expected, atol=0, rtol=0)
    same, _ = apply_rotary(q, q, torch.ones(1, 1, 4), torch.zeros(1, 1, 4))
    torch.testing.assert_close(same, q, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rotary_equals_transformers_bit_for_bit_with_gradients(dtype):
    gen = torch.Generator().manual_seed(0)
    q0, k0 = torch.randn(3, 4, 5, 16, generator=gen), torch.randn(3, 2, 5, 16, generator=gen)
    angles = torch.randn(3, 5, 8, generator=gen)
    cos = torch.cat([angles, angles], -1).cos().to(dtype)
    sin = torch.cat([angles, angles], -1).sin().to(dtype)
    results = []
    for rotate in (apply_rotary_pos_emb, apply_rotary):
        q = q0.to(dtype).requires_grad_()
        k = k0.to(dtype).requires_grad_()
        rq, rk = rotate(q, k, cos, sin)
        (rq.sum() * 3 + (rk * rk).sum()).backward()
        results.append((rq, rk, q.grad, k.grad))
    for got, want in zip(results[1], results[0], strict=True):
        assert torch.equal(got, want)


def test_lean_forward_gives_the_module_logits(model):
    ids = torch.randint(
        1, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0)
    )
    positions = torch.arange(11).expand(3, 11)
    lean = LeanDecoder(model)
    with torch.no_grad():
        got = lean.forward(ids, positions, None, _no_cache)
        want = model(input_ids=ids, use_cache=False).logits[:, -1].float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_lean_unavailable_reason_names_hooks_and_attention(model):
    assert lean_unavailable_reason(model) is None
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    try:
        reason = lean_unavailable_reason(model)
        assert reason is not None and "model.layers.0.mlp has forward hooks" in reason
        with pytest.raises(NotAvailableError, match="forward hooks"):
            LeanDecoder(model)
    finally:
        handle.remove()
    eager = build_random_model("random:qwen3-tiny")
    eager.config._attn_implementation = "eager"
    assert "not 'sdpa'" in (lean_unavailable_reason(eager) or "")
    assert lean_unavailable_reason(eager, require_sdpa=False) is None
    assert "is not one of" in (lean_unavailable_reason(torch.nn.Linear(2, 2)) or "")


def test_engine_keeps_the_lean_forward_when_training_turned_activation_checkpointing_on():
    """A run's first train step turns activation checkpointing on (the default); decoding
    records no gradients, so later rollouts must still use the lean pass."""
    from areno_core.models.loading import enable_activation_checkpointing

    model = build_random_model("random:qwen3-tiny")
    enable_activation_checkpointing(model)
    model.eval()
    assert lean_unavailable_reason(model) is None
    engine, groups = _engine_samples(model, lean=True)
    assert engine._lean is not None
    _, module = _engine_samples(model, lean=False)
    assert [[c.token_ids for c in g] for g in groups] == [[c.token_ids for c in g] for g in module]


def _engine_samples(model, lean: bool):
    engine = NativeEngine(
        model, (), EngineOptions(attn_backend="native"), NativeEngineConfig(lean_forward=lean)
    )
    prompts = [[5, 9, 12, 7], [3, 4], [8, 8, 8, 1, 2, 6]]
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    with RolloutSession(engine) as session:
        groups = session.generate(prompts, sampling, n=2)
    return engine, groups


def test_engine_lean_forward_samples_the_same_tokens_as_the_module(model):
    lean_engine, lean = _engine_samples(model, lean=True)
    _, module = _engine_samples(model, lean=False)
    assert lean_engine._lean is not None  # the lean pass really ran
    for got, want in zip(lean, module, strict=True):
        for a, b in zip(got, want, strict=True):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5
            )


def test_engine_lean_forward_on_bfloat16_model_stays_close_to_float32(model):
    bf16 = build_random_model("random:qwen3-tiny").eval().to(torch.bfloat16)
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    ids = torch.randint(
        1, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1)
    )
    positions = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        low = LeanDecoder(bf16).forward(ids, positions, None, _no_cache)
        high = LeanDecoder(model).forward(ids, positions, None, _no_cache)
    assert low.dtype == torch.float32
    # bfloat16 keeps ~3 significant digits; tiny random logits are O(0.1-1).
    torch.testing.assert_close(low, high, atol=3e-2, rtol=5e-2)
    assert bool((low.argmax(-1) == high.argmax(-1)).all())


# -- weights reordered once for oneDNN (bfloat16 on a CPU with bfloat16 products) -----------

needs_bf16_onednn = pytest.mark.skipif(
    prepack_unavailable_reason(torch.nn.Linear(2, 2, dtype=torch.bfloat16)) is not None,
    reason="needs a CPU with bfloat16 instructions (AVX512-BF16 or AMX) and torch's oneDNN",
)


def _bf16_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_random_model("random:qwen3-tiny", dtype=torch.bfloat16).eval()


def test_prepack_is_refused_for_float32_weights(model):
    assert "not bfloat16" in prepack_unavailable_reason(model)


@needs_bf16_onednn
def test_prepacked_forward_gives_the_same_logits_and_leaves_no_copies():
    bf16 = _bf16_model()
    lean = LeanDecoder(bf16)
    ids = torch.randint(1, 200, (3, 7), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(7).expand(3, 7)
    with torch.no_grad():
        plain = lean.forward(ids, positions, None, _no_cache)
        with lean.prepacked(rows=32) as size:  # a layout chosen for another batch still runs
            assert all(linear.packed is not None for linear in lean._linears())
            packed = lean.forward(ids, positions, None, _no_cache)
    assert size > 0
    assert torch.equal(packed, plain)
    assert all(linear.packed is None for linear in lean._linears())
    with pytest.raises(RuntimeError, match="inside"), lean.prepacked(rows=4):
        raise RuntimeError("inside")
    assert all(linear.packed is None for linear in lean._linears())


@needs_bf16_onednn
def test_prepacked_weights_are_not_used_where_gradients_are_taken():
    bf16 = _bf16_model()
    lean = LeanDecoder(bf16)
    linear = lean.layers[0].up
    x = torch.randn(4, linear.weight.shape[1], dtype=torch.bfloat16)
    with lean.prepacked(rows=4):
        linear(x).float().sum().backward()
    assert bf16.model.layers[0].mlp.up_proj.weight.grad is not None


def _bf16_engine_samples(model, prepacked: bool, max_new_tokens: int = PREPACK_MIN_NEW_TOKENS):
    engine = NativeEngine(
        model,
        (),
        EngineOptions(attn_backend="native"),
        NativeEngineConfig(prepacked_weights=prepacked),
    )
    prompts = [[5, 9, 12, 7], [3, 4], [8, 8, 8, 1, 2, 6]]
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=3)
    groups = engine.generate(prompts, sampling, n=2)
    return [[(c.token_ids, c.logprobs) for c in g] for g in groups]


@needs_bf16_onednn
def test_engine_samples_the_same_with_prepacked_weights_and_sees_each_update(monkeypatch):
    """Same tokens and logprobs with and without the reordered copies, before and after the
    weights change in place between calls (a trainer's step on the shared module): the
    copies are made per call, so the second call samples from the new weights."""
    packs = []
    real = LeanDecoder.prepacked
    monkeypatch.setattr(
        LeanDecoder, "prepacked", lambda self, rows: packs.append(rows) or real(self, rows)
    )
    bf16 = _bf16_model()
    first_packed = _bf16_engine_samples(bf16, prepacked=True)
    assert first_packed == _bf16_engine_samples(bf16, prepacked=False)
    with torch.no_grad():
        for p in bf16.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    second_packed = _bf16_engine_samples(bf16, prepacked=True)
    assert second_packed == _bf16_engine_samples(bf16, prepacked=False)
    assert second_packed != first_packed  # the update changed what is sampled
    assert packs == [6, 6]  # the prepacked calls really reordered, once each, for 3 x 2 rows
    # A call too short for the reordering to pay keeps the plain weights.
    _bf16_engine_samples(bf16, prepacked=True, max_new_tokens=PREPACK_MIN_NEW_TOKENS - 1)
    assert packs == [6, 6]

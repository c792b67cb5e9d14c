"""Packed (padding-free) training rows: the same logprobs and gradients as padded rows."""

from __future__ import annotations

import pytest
import torch

from areno_core.models.scratch import build_random_model
from areno_core.train import forward
from areno_core.train.forward import packed_outputs, policy_outputs

LENGTHS = (5, 9, 3, 7)


def _batch(vocab: int, lengths=LENGTHS) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(1, vocab, (n,), generator=gen)
        mask[row, :n] = 1
    loss_mask = mask.float()
    loss_mask[:, 0] = 0.0
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}


@pytest.fixture(scope="module")
def model():
    return build_random_model("random:qwen3-tiny")


def test_packed_outputs_match_padded_logprobs_and_entropy(model):
    batch = _batch(model.config.vocab_size)
    padded = policy_outputs(model, batch, share_prefix=False, need_entropy=True)
    packed = packed_outputs(model, batch, need_entropy=True)
    valid = batch["attention_mask"].bool()
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(packed[key][valid], padded[key][valid], atol=2e-5, rtol=1e-5)
        assert bool((packed[key][~valid] == 0).all())  # padding positions are zero
        assert bool((packed[key][:, 0] == 0).all())  # the first token is never predicted


def test_packed_outputs_match_padded_gradients(model):
    batch = _batch(model.config.vocab_size)

    def grads(fn) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        out = fn()["logprobs"]
        (out * batch["loss_mask"]).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    padded = grads(lambda: policy_outputs(model, batch, share_prefix=False))
    packed = grads(lambda: packed_outputs(model, batch))
    model.zero_grad(set_to_none=True)
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_policy_outputs_packs_rows_when_the_model_runs_flash(model, monkeypatch):
    batch = _batch(model.config.vocab_size)
    monkeypatch.setattr(forward, "uses_flash", lambda m: True)
    out = policy_outputs(model, batch, share_prefix=False)["logprobs"]
    expected = packed_outputs(model, batch)["logprobs"]
    torch.testing.assert_close(out, expected, atol=0.0, rtol=0.0)
    # An unpadded batch has nothing to pack and runs as it is.
    full = _batch(model.config.vocab_size, lengths=(6, 6))
    calls = []
    monkeypatch.setattr(forward, "packed_outputs", lambda *a, **k: calls.append(1))
    policy_outputs(model, full, share_prefix=False)
    assert calls == []


@pytest.mark.gpu
def test_flash_packed_logprobs_match_sdpa_padded_within_bf16_tolerance():
    """flash-attn (packed rows) against SDPA (padded rows), both in bfloat16 on a GPU. The
    tolerance, 0.05 nats per token, is what bfloat16 rounding over a few layers allows."""
    pytest.importorskip("flash_attn")
    from areno_core.accel.attention import FLASH, flash_unavailable_reason

    if flash_unavailable_reason("cuda", torch.bfloat16) is not None:
        pytest.skip(flash_unavailable_reason("cuda", torch.bfloat16))
    sdpa = build_random_model("random:qwen3-small").to("cuda", torch.bfloat16)
    flash = build_random_model("random:qwen3-small").to("cuda", torch.bfloat16)
    flash.set_attn_implementation(FLASH)
    batch = {k: v.cuda() for k, v in _batch(sdpa.config.vocab_size, (40, 90, 17, 64)).items()}
    with torch.no_grad():
        expected = policy_outputs(sdpa, batch, share_prefix=False)["logprobs"]
        got = policy_outputs(flash, batch, share_prefix=False)["logprobs"]
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(got[valid], expected[valid], atol=0.05, rtol=0.0)

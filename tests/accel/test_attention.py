"""--attn-backend: flash-attn where it can run, else torch SDPA with one warning saying why."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from areno_core import log
from areno_core.accel import attention
from areno_core.accel.attention import (
    FLASH,
    NATIVE,
    choose_attention,
    flash_unavailable_reason,
    sdpa_without_cudnn,
)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA GPU of a given capability, with or without flash-attn installed."""

    def install(capability: tuple[int, int] = (9, 0), *, flash_installed: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(attention, "gpu_capability", lambda device: capability)
        real_find_spec = importlib.util.find_spec

        def find_spec(name, *args, **kwargs):
            if name == "flash_attn":
                return object() if flash_installed else None
            return real_find_spec(name, *args, **kwargs)

        monkeypatch.setattr(attention.importlib.util, "find_spec", find_spec)

    return install


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(log, "_WARNED", set())


def test_flash_reason_on_cpu_names_the_missing_gpu():
    assert flash_unavailable_reason("cpu", torch.bfloat16) == "the model is not on a CUDA GPU"


def test_flash_reason_without_package_says_how_to_install(fake_gpu):
    fake_gpu(flash_installed=False)
    reason = flash_unavailable_reason("cuda:0", torch.bfloat16)
    assert reason == "flash-attn is not installed (pip install flash-attn)"


def test_flash_reason_on_a_t4_names_its_capability(fake_gpu):
    fake_gpu((7, 5))
    reason = flash_unavailable_reason("cuda:0", torch.float16)
    assert reason is not None and "compute capability 7.5" in reason and "Ampere" in reason


def test_flash_reason_in_float32_points_at_dtype(fake_gpu):
    fake_gpu((8, 0))
    reason = flash_unavailable_reason("cuda:0", torch.float32)
    assert reason == "the model is in float32; flash-attn needs float16 or bfloat16"


@pytest.mark.parametrize(
    ("backend", "device", "dtype", "expected"),
    [
        ("flash", "cuda:0", torch.bfloat16, FLASH),
        ("flash", "cuda:0", torch.float16, FLASH),
        ("native", "cuda:0", torch.bfloat16, NATIVE),
        ("native", "cpu", torch.float32, NATIVE),
    ],
)
def test_choose_attention_on_a_supported_gpu_gives_the_backend_without_warning(
    fake_gpu, caplog, backend, device, dtype, expected
):
    fake_gpu((9, 0))
    with caplog.at_level(logging.WARNING, logger="areno"):
        assert choose_attention(backend, device, dtype) == expected
    assert caplog.records == []


def test_choose_attention_fallback_warns_once_with_the_reason(fake_gpu, caplog):
    fake_gpu((7, 5))
    with caplog.at_level(logging.WARNING, logger="areno"):
        assert choose_attention("flash", "cuda:0", torch.float16) == NATIVE
        assert choose_attention("flash", "cuda:0", torch.float16) == NATIVE
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert "--attn-backend flash is unavailable" in text
    assert "compute capability 7.5" in text and "torch SDPA" in text


def test_choose_attention_rejects_unknown_backend():
    with pytest.raises(ValueError, match="--attn-backend must be one of flash, native"):
        choose_attention("xformers", "cpu", torch.float32)


@pytest.fixture
def cudnn_sdpa_flag():
    """The process-wide cuDNN SDPA flag, put back as it was after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_sdpa_without_cudnn_turns_cudnn_off_on_a_gpu_and_puts_it_back(cudnn_sdpa_flag):
    backends = torch.backends.cuda
    torch.backends.cuda.enable_cudnn_sdp(True)
    others = (backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled())
    with sdpa_without_cudnn("cuda:0"):
        assert not backends.cudnn_sdp_enabled()
        assert (backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled()) == others
    assert backends.cudnn_sdp_enabled()
    with pytest.raises(KeyError), sdpa_without_cudnn(torch.device("cuda")):
        raise KeyError("raised inside")
    assert backends.cudnn_sdp_enabled()
    with sdpa_without_cudnn("cpu"):
        assert backends.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)  # a user who turned it off keeps it off
    with sdpa_without_cudnn("cuda"):
        pass
    assert not backends.cudnn_sdp_enabled()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_forward_and_backward_on_a_gpu_run_no_cudnn_attention():
    from torch.profiler import ProfilerActivity, profile

    from areno_core.models.scratch import build_random_model
    from areno_core.train.forward import policy_outputs

    model = build_random_model("random:qwen3-tiny", dtype=torch.bfloat16).to("cuda").train()
    model.set_attn_implementation(NATIVE)
    ids = torch.randint(3, model.config.vocab_size, (4, 48), device="cuda")
    mask = torch.ones_like(ids)
    mask[1:, 40:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.float()}
    with profile(activities=[ProfilerActivity.CPU]) as prof, sdpa_without_cudnn("cuda"):
        policy_outputs(model, batch)["logprobs"].sum().backward()
    names = {event.key for event in prof.key_averages()}
    assert any("attention" in name for name in names), sorted(names)
    assert not [name for name in names if "cudnn_attention" in name]

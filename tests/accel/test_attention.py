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

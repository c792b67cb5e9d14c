"""--dtype resolution: bfloat16 on GPUs that compute in it, float32 elsewhere."""

from __future__ import annotations

import logging

import pytest
import torch

from areno_core.accel import precision
from areno_core.accel.precision import resolve_run_dtype, supports_bf16
from areno_core.config import DTYPE_CHOICES, build_config, default_of
from areno_core.errors import ConfigError, NotAvailableError


@pytest.fixture
def gpu_capability(monkeypatch):
    """Pretend a CUDA GPU of the given compute capability."""

    def set_capability(major: int, minor: int) -> None:
        monkeypatch.setattr(precision, "gpu_capability", lambda device: (major, minor))

    return set_capability


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_resolve_run_dtype_auto_on_cpu_is_float32(device):
    assert resolve_run_dtype("auto", device) == torch.float32


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)],
)
def test_resolve_run_dtype_explicit_on_cpu_is_kept(choice, expected):
    assert resolve_run_dtype(choice, "cpu") == expected


@pytest.mark.parametrize(("capability", "expected"), [((8, 0), torch.bfloat16),
                                                       ((9, 0), torch.bfloat16),
                                                       ((7, 5), torch.float32),
                                                       ((7, 0), torch.float32)])  # fmt: skip
def test_resolve_run_dtype_auto_on_gpu_follows_bf16_support(gpu_capability, capability, expected):
    gpu_capability(*capability)
    assert resolve_run_dtype("auto", "cuda:0") == expected


def test_resolve_run_dtype_auto_on_old_gpu_says_why_float32(gpu_capability, caplog):
    gpu_capability(7, 5)
    with caplog.at_level(logging.INFO, logger="areno"):
        resolve_run_dtype("auto", "cuda:0")
    assert "compute capability 7.5" in caplog.text and "float32" in caplog.text


def test_resolve_run_dtype_bfloat16_on_old_gpu_is_refused(gpu_capability):
    gpu_capability(7, 5)
    with pytest.raises(NotAvailableError, match=r"compute capability 7\.5.*needs 8\.0"):
        resolve_run_dtype("bfloat16", "cuda:0")
    assert resolve_run_dtype("float16", "cuda:0") == torch.float16


def test_resolve_run_dtype_unknown_choice_names_valid_ones():
    with pytest.raises(ValueError, match="--dtype must be one of auto, float32, bfloat16, float16"):
        resolve_run_dtype("fp8", "cpu")


def test_supports_bf16_on_cpu_and_by_capability(gpu_capability):
    assert supports_bf16("cpu")
    gpu_capability(8, 6)
    assert supports_bf16("cuda:0")
    gpu_capability(7, 5)
    assert not supports_bf16("cuda:0")


def test_dtype_option_defaults_to_auto_and_rejects_unknown_values():
    assert default_of("dtype") == "auto"
    assert DTYPE_CHOICES == ("auto", "float32", "bfloat16", "float16")
    assert build_config({"dtype": "bfloat16"}).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="--dtype must be one of auto, float32, bfloat16"):
        build_config({"dtype": "half"})


@pytest.mark.gpu
def test_resolve_run_dtype_auto_on_this_gpu_matches_its_capability():
    major, _ = torch.cuda.get_device_capability(0)
    expected = torch.bfloat16 if major >= 8 else torch.float32
    assert resolve_run_dtype("auto", "cuda:0") == expected


@pytest.mark.parametrize("has_bf16", [True, False])
def test_resolve_run_dtype_bfloat16_on_cpu_warns_only_without_bf16_instructions(
    monkeypatch, caplog, has_bf16
):
    from areno_core import log

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: has_bf16)
    monkeypatch.setattr(log, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="areno"):
        assert resolve_run_dtype("bfloat16", "cpu") == torch.bfloat16
    assert ("no bfloat16 instructions" in caplog.text) is (not has_bf16)


def test_cpu_has_bf16_agrees_with_the_cpu_flags():
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        assert precision.cpu_has_bf16() is True
    elif "avx512" not in flags:
        assert precision.cpu_has_bf16() is False
    else:
        pytest.skip("AVX-512 without a bfloat16 extension: oneDNN's answer is its own")

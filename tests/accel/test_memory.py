"""Peak memory per phase (process RSS on a CPU) and moving optimizer state between devices."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from areno_core.accel import memory
from areno_core.accel.memory import (
    MIB,
    MemoryMeter,
    PhaseMemory,
    move_optimizer_state,
    optimizer_tensors,
    process_rss_bytes,
    system_memory_bytes,
)
from areno_core.train.optim import build_optimizer

BLOCK = 256 * MIB


def _touch(size: int) -> bytearray:
    block = bytearray(size)
    for i in range(0, size, 4096):  # make every page resident
        block[i] = 1
    return block


def test_cpu_meter_sees_a_peak_that_was_freed_before_the_block_ended():
    meter = MemoryMeter("cpu")
    with meter.measure() as measured:
        start = process_rss_bytes()
        block = _touch(BLOCK)
        del block
    assert measured.exact
    assert measured.peak_bytes >= start + BLOCK * 0.9
    # A second, quiet block starts from a reset peak: it does not see the old one.
    with meter.measure() as quiet:
        pass
    assert quiet.peak_bytes < measured.peak_bytes - BLOCK * 0.5


def test_cpu_meter_without_peak_reset_falls_back_to_the_lifetime_peak(monkeypatch):
    monkeypatch.setattr(memory, "_reset_peak_rss", lambda: False)
    lifetime = iter([1000 * MIB, 1300 * MIB])  # the block raised the lifetime peak
    monkeypatch.setattr(memory, "_lifetime_peak_rss_bytes", lambda: next(lifetime))
    monkeypatch.setattr(memory, "process_rss_bytes", lambda: 400 * MIB)
    with MemoryMeter("cpu").measure() as measured:
        pass
    assert measured.peak_bytes == 1300 * MIB and measured.exact
    unchanged = iter([1000 * MIB, 1000 * MIB])  # it did not: only a lower bound is known
    monkeypatch.setattr(memory, "_lifetime_peak_rss_bytes", lambda: next(unchanged))
    with MemoryMeter("cpu").measure() as measured:
        pass
    assert measured.peak_bytes == 400 * MIB and not measured.exact


def test_cpu_capacity_is_the_machines_ram():
    meter = MemoryMeter("cpu")
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    assert meter.capacity_bytes() == system_memory_bytes() == total_kib * 1024
    assert not meter.on_gpu and "system RAM" in meter.what


def test_phase_memory_reports_each_phase_in_mib_and_resets():
    phases = PhaseMemory(MemoryMeter("cpu"))
    with phases("rollout"):
        block = _touch(BLOCK)
        del block
    with phases("train"):
        pass
    out = phases.pop()
    assert set(out) == {"memory/rollout_peak_mib", "memory/train_peak_mib"}
    assert out["memory/rollout_peak_mib"] >= out["memory/train_peak_mib"] + 0.5 * BLOCK / MIB
    assert phases.pop() == {}


def _trained_optimizer(dtype: torch.dtype) -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
    param = torch.nn.Parameter(torch.ones(64, 32, dtype=dtype))
    opt = build_optimizer([param], lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, adam_8bit=False)
    param.sum().backward()
    opt.step()
    opt.zero_grad()
    return param, opt


def test_optimizer_tensors_are_the_moments_not_the_step_count():
    _, opt = _trained_optimizer(torch.float32)
    keys = sorted(key for _, key in optimizer_tensors(opt))
    assert keys == ["exp_avg", "exp_avg_sq"]


def test_move_optimizer_state_counts_moments_and_master_weights(monkeypatch):
    _, plain = _trained_optimizer(torch.float32)
    assert move_optimizer_state([plain, None], "cpu") == 0  # already there: nothing moves
    # A CPU has no second device: record what would move instead of moving it.
    moved: list[tuple[tuple[int, ...], torch.dtype, str]] = []

    def fake_to(tensor: torch.Tensor, device: torch.device, pin: bool) -> torch.Tensor:
        moved.append((tuple(tensor.shape), tensor.dtype, device.type))
        return tensor.clone()

    monkeypatch.setattr(memory, "_to", fake_to)
    assert move_optimizer_state([plain], "cuda") == 2 * 64 * 32 * 4
    assert moved == [((64, 32), torch.float32, "cuda")] * 2  # exp_avg, exp_avg_sq
    moved.clear()
    param, master_opt = _trained_optimizer(torch.bfloat16)
    # the float32 moments and the float32 master copy of the bfloat16 weight
    assert move_optimizer_state([master_opt], "cuda") == 3 * 64 * 32 * 4
    assert moved == [((64, 32), torch.float32, "cuda")] * 3
    assert param.dtype == torch.bfloat16  # the model's weight itself never moves


@pytest.mark.gpu
def test_move_optimizer_state_round_trip_on_gpu_keeps_training_identical():
    def run(offload: bool) -> torch.Tensor:
        torch.manual_seed(0)
        param = torch.nn.Parameter(torch.randn(128, 64, device="cuda", dtype=torch.bfloat16))
        opt = build_optimizer(
            [param], lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, adam_8bit=False
        )
        for _ in range(3):
            (param.float() ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
            if offload:
                assert move_optimizer_state([opt], "cpu") > 0
                assert move_optimizer_state([opt], "cuda") > 0
        return param.detach().clone()

    torch.testing.assert_close(run(True), run(False), atol=0.0, rtol=0.0)


@pytest.mark.gpu
def test_gpu_meter_sees_an_allocation_inside_the_block():
    meter = MemoryMeter("cuda")
    with meter.measure() as measured:
        start = torch.cuda.memory_reserved()
        block = torch.empty(BLOCK, dtype=torch.uint8, device="cuda")
        del block
    assert measured.peak_bytes >= start + BLOCK
    assert measured.peak_bytes <= meter.capacity_bytes()

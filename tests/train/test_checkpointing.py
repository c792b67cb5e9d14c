"""``--activation-checkpointing`` auto: the planner's activation estimate against free memory."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.config import default_of
from areno_core.models.loading import is_activation_checkpointing
from areno_core.plan.estimate import Setup, estimate
from areno_core.plan.shapes import shape_from_config
from areno_core.train.checkpointing import (
    AUTO_SHARE,
    choose_activation_checkpointing,
    resolve_activation_checkpointing,
)
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

GIB = 1024**3


def tiny_policy() -> transformers.Qwen3ForCausalLM:
    config = transformers.Qwen3Config(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, intermediate_size=64, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(config)


def activations(policy, rows: int, seq_len: int) -> int:
    setup = Setup(
        shape=shape_from_config(policy.config),
        seq_len=seq_len,
        micro_batch=rows,
        dtype="float32",
        device="cpu",
    )
    return next(i.bytes for i in estimate(setup).activation_items if i.name == "activations")


def test_auto_is_off_within_half_the_free_memory_and_on_beyond_it():
    policy = tiny_policy()
    need = activations(policy, 4, 100)
    # By hand: 2 layers x per-layer bytes + head, x 400 tokens; what matters here is the
    # threshold: exactly half the free memory is still "within".
    within = choose_activation_checkpointing(
        policy, rows=4, seq_len=100, device="cpu", available=int(need / AUTO_SHARE)
    )
    beyond = choose_activation_checkpointing(
        policy, rows=4, seq_len=100, device="cpu", available=int(need / AUTO_SHARE) - 1
    )
    assert (within.enabled, beyond.enabled) == (False, True)
    assert within.activations == beyond.activations == need
    assert within.reason.startswith("off: a micro-batch of 4 rows x 100 tokens")
    assert beyond.reason.startswith("on: ") and "(over 50%)" in beyond.reason


def test_estimate_grows_with_rows_and_length_as_the_planner_says():
    policy = tiny_policy()
    one = activations(policy, 1, 64)
    assert activations(policy, 2, 64) == 2 * one
    assert activations(policy, 1, 128) == 2 * one
    choice = choose_activation_checkpointing(policy, rows=2, seq_len=64, device="cpu")
    assert choice.activations == 2 * one and choice.available and choice.available > 0


def test_explicit_settings_are_kept_and_unknown_shapes_stay_on():
    policy = tiny_policy()
    assert resolve_activation_checkpointing(True, policy, rows=1, seq_len=8, device="cpu")
    assert not resolve_activation_checkpointing(False, policy, rows=1, seq_len=8, device="cpu")
    odd = choose_activation_checkpointing(torch.nn.Linear(2, 2), rows=1, seq_len=8, device="cpu")
    assert odd.enabled and "cannot read this model's config" in odd.reason


def test_default_is_auto_and_the_local_backend_logs_its_decision(caplog):
    assert default_of("activation_checkpointing") is None
    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    samples = [
        Trajectory(
            input_ids=[5] * 6 + [9 + s] * 4,
            loss_mask=[0] * 6 + [1] * 4,
            rollout_logprobs=[0.0] * 6 + [-5.0] * 4,
            reward=float(s),
            prompt_len=6,
            prompt_index=0,
            sample_index=s,
        )
        for s in range(2)
    ]
    group = TrajectoryGroup(item=PromptItem(index=0, row={"prompt": "x"}, prompt="x"),
                            trajectories=samples)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="areno"):
        LocalBackend(device="cpu").train(model, [group], algorithm="grpo", mini_bs=2)
    # A tiny model on a machine with gigabytes free: checkpointing stays off, and says why.
    assert not is_activation_checkpointing(model.policy)
    said = [r.getMessage() for r in caplog.records if "activation checkpointing auto" in r.message]
    assert len(said) == 1 and said[0].startswith("activation checkpointing auto: off: ")
    rows = f"2 rows x {default_of('max_prompt_tokens') + default_of('max_new_tokens')} tokens"
    assert rows in said[0]


@pytest.mark.parametrize("setting", [True, False])
def test_local_backend_follows_an_explicit_setting(setting):
    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    spec = LocalBackend(device="cpu").algorithm("sft")
    LocalBackend(device="cpu").setup(model, spec, activation_checkpointing=setting)
    assert is_activation_checkpointing(model.policy) is setting


@pytest.mark.parametrize(
    ("device", "packed", "checkpointing", "expected"),
    [
        ("cpu", None, True, True),
        ("cpu", None, False, True),
        ("cpu", False, True, False),
        ("cpu", True, False, True),
        ("cuda", None, False, True),
        ("cuda", None, True, True),
        ("cuda", False, False, False),
        ("meta", None, False, False),
        ("meta", True, False, True),
    ],
)
def test_packed_forward_auto_packs_on_cpu_and_cuda_whether_or_not_activations_are_checkpointed(
    device, packed, checkpointing, expected
):
    # Auto packs on a CPU and a CUDA GPU, with checkpointing on (only the packed forward
    # shares a prompt between rows then) and off (measured as fast or faster on both); on
    # devices where it was not measured ("meta" stands for one) it stays padded.
    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    backend = LocalBackend(device="cpu", packed_forward=packed)
    backend.setup(model, backend.algorithm("grpo"), activation_checkpointing=checkpointing)
    backend.device = device  # the decision reads the device type only
    assert backend._updater.packed_forward is expected

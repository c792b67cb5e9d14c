"""Policy weights packed into shared memory for the rollout worker."""

from __future__ import annotations

import torch

from areno_core.rollout.weights import pack_tensors, pack_weights


def test_pack_weights_round_trips_every_parameter_once_in_shared_memory() -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    module[1].weight = module[0].weight  # tied, like embeddings and the LM head
    packed = pack_weights(module)
    state = packed.state_dict()
    assert list(state) == ["0.weight", "0.bias", "1.bias"]  # the tied weight once
    for name, param in module.named_parameters():
        assert torch.equal(state[name], param.detach())
    assert list(packed.buffers) == ["float32"]
    assert packed.buffers["float32"].is_shared()
    assert packed.nbytes == 4 * (9 + 3 + 3)
    # Loaded into a copy with the same tie, the copy computes what the module does.
    twin = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    twin[1].weight = twin[0].weight
    twin.load_state_dict(state, strict=False)
    x = torch.randn(2, 3)
    assert torch.equal(twin(x), module(x))


def test_packed_weights_are_a_copy_later_updates_do_not_reach() -> None:
    module = torch.nn.Linear(2, 2)
    packed = pack_weights(module)
    before = packed.state_dict()["weight"].clone()
    with torch.no_grad():
        module.weight.add_(1.0)
    assert torch.equal(packed.state_dict()["weight"], before)


def test_pack_tensors_keeps_one_buffer_per_dtype() -> None:
    half = torch.arange(6, dtype=torch.bfloat16).view(2, 3)
    full = torch.tensor([1.5, -2.0])
    packed = pack_tensors([("a", half), ("b", full), ("c", half[1])])
    assert sorted(packed.buffers) == ["bfloat16", "float32"]
    state = packed.state_dict()
    assert state["a"].dtype == torch.bfloat16 and torch.equal(state["a"], half)
    assert torch.equal(state["b"], full)
    assert torch.equal(state["c"], half[1])

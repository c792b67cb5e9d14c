from __future__ import annotations

import torch

from areno_core.models.loading import enable_activation_checkpointing
from areno_core.models.scratch import build_random_model
from areno_core.train.batching import collate
from areno_core.train.forward import _unique_rows, policy_outputs, shared_prefix_plan
from areno_core.types import Trajectory

TOL = {"atol": 2e-5, "rtol": 2e-5}


def group_rows(prompts: list[list[int]], completions: list[list[list[int]]]) -> list[Trajectory]:
    rows = []
    for g, (prompt, samples) in enumerate(zip(prompts, completions, strict=True)):
        for completion in samples:
            rows.append(
                Trajectory(
                    input_ids=[*prompt, *completion],
                    loss_mask=[0] * len(prompt) + [1] * len(completion),
                    rollout_logprobs=[0.0] * (len(prompt) + len(completion)),
                    prompt_len=len(prompt),
                    prompt_index=g,
                )
            )
    return rows


def grouped_batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, 250, (n,), generator=gen).tolist()

    prompts = [tokens(30), tokens(24), tokens(27)]
    completions = [[tokens(n) for n in (5, 8, 3, 8)] for _ in prompts]
    return collate(group_rows(prompts, completions), pad_id=0)


def test_shared_prefix_plan_finds_one_prefix_per_group():
    batch = grouped_batch()
    plan = shared_prefix_plan(batch)
    assert plan is not None
    assert plan.prefix_rows.shape == (3,)
    assert sorted(plan.prefix_len.tolist()) == [24, 27, 30]
    assert plan.row_prefix.view(3, 4).unique(dim=1).shape[1] == 1  # same prefix within a group
    assert plan.start.tolist() == [30] * 4 + [24] * 4 + [27] * 4


def test_shared_prefix_plan_is_none_without_repeated_prompts():
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 250, (20,), generator=gen).tolist() for _ in range(4)]
    batch = collate(group_rows(prompts, [[[1, 2, 3]] for _ in prompts]), pad_id=0)
    assert shared_prefix_plan(batch) is None


def test_shared_prefix_plan_is_none_when_a_row_is_scored_from_its_first_token():
    batch = grouped_batch()
    batch["loss_mask"][0, 0] = 1.0
    assert shared_prefix_plan(batch) is None


def test_shared_prefix_outputs_match_full_rows_in_values_and_gradients():
    model = build_random_model("random:qwen3-tiny")
    model.train()
    batch = grouped_batch()
    mask = batch["loss_mask"]
    grads = []
    outputs = []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        out = policy_outputs(model, batch, need_entropy=True, share_prefix=share)
        (out["logprobs"] * mask).sum().backward()
        outputs.append(out)
        grads.append([p.grad.clone() for p in model.parameters()])
    full, shared = outputs
    torch.testing.assert_close(shared["logprobs"] * mask, full["logprobs"] * mask, **TOL)
    torch.testing.assert_close(shared["entropy"] * mask, full["entropy"] * mask, **TOL)
    assert (shared["logprobs"][mask == 0] == 0).all()
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(b, a, **TOL)


def test_shared_prefix_is_skipped_with_activation_checkpointing():
    model = build_random_model("random:qwen3-tiny")
    enable_activation_checkpointing(model)
    model.train()
    batch = grouped_batch()
    out = policy_outputs(model, batch)
    # The full-row path scores prompt tokens too: some are nonzero before the first loss token.
    assert (out["logprobs"][batch["loss_mask"] == 0] != 0).any()


def test_unique_rows_equal_torch_unique_with_inverse():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        distinct = torch.randint(
            -1, 4, (int(torch.randint(1, 9, (1,), generator=gen)), 6), generator=gen
        )
        keys = distinct[torch.randint(0, distinct.shape[0], (40,), generator=gen)]
        expected = torch.unique(keys, dim=0, return_inverse=True)
        got = _unique_rows(keys)
        for e, g in zip(expected, got, strict=True):
            assert torch.equal(g, e) and g.dtype == e.dtype

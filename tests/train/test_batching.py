from __future__ import annotations

import torch

from areno_core.train.batching import (
    collate,
    padding_fraction,
    plan_steps,
    select_rows,
    sort_by_length,
)
from areno_core.types import Trajectory


def traj(n: int, prompt: int, reward: float = 0.0, group: int = 0) -> Trajectory:
    return Trajectory(
        input_ids=list(range(1, n + 1)),
        loss_mask=[0] * prompt + [1] * (n - prompt),
        rollout_logprobs=[0.0] * prompt + [-0.5] * (n - prompt),
        reward=reward,
        prompt_index=group,
    )


def test_collate_right_pads_and_aligns_fields():
    batch = collate([traj(3, 1, 1.0, 0), traj(5, 2, 0.0, 1)], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0, 0], [1, 2, 3, 4, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]]
    assert batch["rollout_logprobs"][1].tolist() == [0, 0, -0.5, -0.5, -0.5]
    assert batch["rewards"].tolist() == [1.0, 0.0]
    assert batch["group_index"].tolist() == [0, 1]
    assert batch["lengths"].tolist() == [3, 5]


def test_select_rows_trims_to_longest_selected_row():
    batch = collate([traj(3, 1), traj(9, 2), traj(4, 1)], pad_id=0)
    sub = select_rows(batch, [0, 2])
    assert sub["input_ids"].shape == (2, 4)
    assert sub["lengths"].tolist() == [3, 4]


def test_plan_steps_splits_units_into_steps_of_microbatches():
    gen = torch.Generator().manual_seed(0)
    steps = plan_steps(num_units=6, unit_rows=1, mini_bs=2, accumulation=2, generator=gen)
    assert [len(s) for s in steps] == [2, 1]
    assert sorted(r for s in steps for m in s for r in m) == list(range(6))
    assert all(len(m) == 2 for s in steps for m in s)


def test_plan_steps_keeps_preference_pairs_together():
    gen = torch.Generator().manual_seed(3)
    steps = plan_steps(num_units=4, unit_rows=2, mini_bs=4, accumulation=None, generator=gen)
    assert len(steps) == 1
    for micro in steps[0]:
        for i in range(0, len(micro), 2):
            assert micro[i] % 2 == 0 and micro[i + 1] == micro[i] + 1


def test_sort_by_length_groups_similar_rows_and_cuts_padding():
    lengths = torch.tensor([10, 2, 9, 3])
    step = [[0, 1], [2, 3]]
    before = padding_fraction(step, lengths)
    after_step = sort_by_length(step, lengths, unit_rows=1)
    assert after_step == [[1, 3], [2, 0]]
    assert padding_fraction(after_step, lengths) < before
    assert padding_fraction([[1, 3], [2, 0]], lengths) == 1 - 24 / 26

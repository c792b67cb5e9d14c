"""The default placement of a training step's passes: everything in this process."""

from __future__ import annotations

import torch

from areno_core.train.placement import SingleProcess, padded_passes, score_rows


def test_single_process_layout_is_the_plan_of_every_microbatch():
    micros = [[3, 1], [0, 2]]
    layout = SingleProcess().layout(micros, lambda m: [sorted(x) for x in m], 1, torch.ones(4))
    assert layout == [[[1, 3], [0, 2]]]


def test_padded_passes_fill_a_shorter_rank_with_empty_passes():
    layout = [[[0, 1], [2]], [[3]], []]
    assert padded_passes(layout, 0) == [[0, 1], [2]]
    assert padded_passes(layout, 1) == [[3], []]
    assert padded_passes(layout, 2) == [[], []]


def test_score_rows_fills_planned_rows_and_runs_empty_passes_without_writing():
    batch = {
        "input_ids": torch.tensor([[1, 2, 3], [4, 5, 0], [6, 0, 0]]),
        "lengths": torch.tensor([3, 2, 1]),
    }
    calls = []

    def scorer(mb):
        calls.append(mb["input_ids"].tolist())
        return mb["input_ids"].float() * 10

    out = score_rows(batch, [[1], [], [2, 0]], torch.device("cpu"), scorer)
    assert calls == [[[4, 5]], [[1, 2, 3]], [[6, 0, 0], [1, 2, 3]]]  # the empty pass: row 0
    torch.testing.assert_close(
        out, torch.tensor([[10.0, 20, 30], [40, 50, 0], [60, 0, 0]]), rtol=0, atol=0
    )
    assert score_rows(batch, [[1]], torch.device("cpu"), scorer)[0].abs().sum() == 0

"""How a step's rows are dealt to data-parallel ranks and how their statistics combine
(pure functions; no processes)."""

from __future__ import annotations

import torch

from areno_core.train.distributed.context import combine_rank_stats
from areno_core.train.distributed.placement import deal_units


def test_deal_units_back_and_forth_by_length_keeps_microbatch_size():
    lengths = torch.tensor([5, 9, 2, 7, 3, 8])
    # longest first: rows 1 (9), 5 (8), 3 (7), 0 (5), 4 (3), 2 (2) -> ranks 0, 1, 1, 0, 0, 1
    shares = deal_units([[0, 1], [2, 3], [4, 5]], lengths, 1, 2)
    assert shares == [[[1, 0], [4]], [[5, 3], [2]]]


def test_deal_units_keeps_preference_pairs_together():
    lengths = torch.tensor([4, 6, 9, 9, 1, 2, 5, 5])  # pairs (0,1) (2,3) (4,5) (6,7)
    # pair lengths 6, 9, 2, 5: longest first (2,3) (0,1) (6,7) (4,5) -> ranks 0, 1, 1, 0
    shares = deal_units([[0, 1, 2, 3], [4, 5, 6, 7]], lengths, 2, 2)
    assert shares == [[[2, 3, 4, 5]], [[0, 1, 6, 7]]]
    for share in shares:
        for micro in share:
            assert all(micro[i] % 2 == 0 and micro[i + 1] == micro[i] + 1 for i in (0, 2))


def test_deal_units_more_ranks_than_rows_leaves_some_ranks_empty():
    shares = deal_units([[0, 1]], torch.tensor([3, 4]), 1, 4)
    assert shares == [[[1]], [[0]], [], []]


def test_combine_rank_stats_sums_extremes_and_losses_in_rank_order():
    totals, mins, maxs, losses = combine_rank_stats(
        [
            ({"train/a": 1.0}, {"train/r_min": 0.5}, {"train/r_max": 1.5}, [0.25, 1.0]),
            ({"train/a": 2.0, "train/b": 1.0}, {}, {"train/r_max": 2.5}, [0.5, 2.0]),
        ]
    )
    assert totals == {"train/a": 3.0, "train/b": 1.0}
    assert mins == {"train/r_min": 0.5}
    assert maxs == {"train/r_max": 2.5}
    assert losses == [0.75, 3.0]

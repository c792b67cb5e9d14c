from __future__ import annotations

import torch

from areno_core.train.batching import padding_fraction, split_by_padding


def test_split_by_padding_separates_far_apart_lengths():
    lengths = torch.tensor([100, 900, 110, 905])
    pieces = split_by_padding([0, 1, 2, 3], lengths, piece_cost=16)
    assert pieces == [[0, 2], [1, 3]]
    assert padding_fraction(pieces, lengths) < padding_fraction([[0, 1, 2, 3]], lengths)


def test_split_by_padding_keeps_rows_together_when_a_pass_costs_more_than_the_padding():
    lengths = torch.tensor([100, 120, 130])
    assert split_by_padding([2, 0, 1], lengths, piece_cost=1000) == [[0, 1, 2]]


def test_split_by_padding_keeps_every_row_once():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 500, (16,), generator=gen)
    pieces = split_by_padding(list(range(16)), lengths, piece_cost=8)
    assert sorted(r for piece in pieces for r in piece) == list(range(16))

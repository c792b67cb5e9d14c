from __future__ import annotations

import pytest

from areno_core.data.stream import DataStream
from areno_core.errors import DatasetError


def drain(stream: DataStream) -> list[list[int]]:
    out = []
    while (batch := stream.next_batch()) is not None:
        out.append(batch)
    return out


def test_stream_covers_every_row_once_per_epoch_with_partial_last_batch():
    stream = DataStream(list(range(10)), 4, seed=1, epochs=2)
    batches = drain(stream)
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    epoch1 = [r for b in batches[:3] for r in b]
    epoch2 = [r for b in batches[3:] for r in b]
    assert sorted(epoch1) == list(range(10))
    assert epoch1 != epoch2  # a new order each epoch
    assert stream.total_steps == 6


def test_stream_resumed_from_state_continues_identically_across_epoch_boundary():
    full = drain(DataStream(list(range(10)), 4, seed=5, epochs=3))
    first = DataStream(list(range(10)), 4, seed=5, epochs=3)
    head = [first.next_batch() for _ in range(3)]  # ends exactly at the epoch boundary
    resumed = DataStream(list(range(10)), 4, seed=5, epochs=3)
    resumed.load_state_dict(first.state_dict())
    assert head + drain(resumed) == full


def test_stream_state_from_other_dataset_size_is_rejected():
    stream = DataStream(list(range(5)), 2, seed=0, epochs=1)
    with pytest.raises(DatasetError, match="dataset of 7 rows, but this run's dataset has 5"):
        stream.load_state_dict({"epoch": 0, "offset": 2, "num_rows": 7})

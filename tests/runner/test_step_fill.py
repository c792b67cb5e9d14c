"""``CompletionFill``: the trainer's pool of finished groups under ``--step-fill completion``,
and the state a checkpoint keeps so that a resumed run trains every row once."""

from __future__ import annotations

import pytest

from areno_core.runner.step_fill import CompletionFill
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup


def group(index: int) -> TrajectoryGroup:
    trajectory = Trajectory(
        input_ids=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -1.0], prompt_len=1
    )
    return TrajectoryGroup(
        item=PromptItem(index=index, row={}, prompt="p"), trajectories=[trajectory]
    )


def test_a_step_takes_the_first_groups_to_finish_from_any_batch():
    fill = CompletionFill(batch_size=2)
    fill.sent(0, 0, [0, 1], agent_seed=7)
    fill.sent(1, 1, [2, 3], agent_seed=8)
    assert not fill.ready()
    fill.arrived(0, group(1))
    fill.arrived(1, group(3))  # step 1's group finishes before step 0's straggler (prompt 0)
    assert fill.ready()
    taken, closed, streamed = fill.take(0)
    assert [(key, g.item.index) for key, g in taken] == [(0, 1), (1, 3)]
    assert closed == [] and streamed == 2
    # Both batches come back; the next step takes the rest, oldest first.
    fill.closed(1, [group(2)], {"rollout/agent_errors": 0.0})
    fill.closed(0, [group(0)], {"rollout/agent_errors": 1.0})
    taken, closed, streamed = fill.take(1)
    assert [(key, g.item.index) for key, g in taken] == [(1, 2), (0, 0)]
    assert streamed == 0  # both came with their batches
    assert [m["rollout/agent_errors"] for m in closed] == [0.0, 1.0]
    assert fill.requests == {}  # every request settled


def test_a_step_takes_fewer_groups_once_no_batch_is_open():
    fill = CompletionFill(batch_size=4)
    fill.sent(0, 0, [0, 1, 2, 3], agent_seed=None)
    fill.closed(0, [group(0), group(2)], {})  # two prompts dropped (failed, or uniform)
    assert fill.ready()
    taken, _, _ = fill.take(0)
    assert [g.item.index for _, g in taken] == [0, 2]


def test_an_unexpected_group_is_refused():
    fill = CompletionFill(batch_size=2)
    fill.sent(0, 0, [0, 1], agent_seed=None)
    fill.arrived(0, group(0))
    with pytest.raises(RuntimeError, match="unexpected group for prompt 0"):
        fill.arrived(0, group(0))
    with pytest.raises(RuntimeError, match="unexpected group for prompt 5"):
        fill.arrived(0, group(5))


def test_the_checkpoint_state_owes_the_untrained_rows_and_skips_those_trained_ahead():
    fill = CompletionFill(batch_size=2)
    fill.sent(0, 0, [0, 1], agent_seed=7)
    fill.sent(1, 1, [2, 3], agent_seed=8)
    fill.sent(2, 2, [4, 5], agent_seed=9)
    fill.arrived(0, group(1))
    fill.arrived(1, group(3))
    fill.take(0)  # step 0 trained prompts 1 and 3
    fill.arrived(2, group(5))  # arrived, not trained
    # The loop has passed step 0 only: prompt 0 is owed (still out); step 1 had prompt 3
    # trained early; step 2's arrived group is simply rolled out again after a resume.
    state = fill.state_dict(consumed=1)
    assert state == {"owed": [[0, [0], 7]], "ahead": [[1, [3]]]}
    # After step 1 too: prompt 2 (out) is owed as well, under step 1's seed.
    assert fill.state_dict(consumed=2)["owed"] == [[0, [0], 7], [1, [2], 8]]
    # A group that arrived but was not trained is owed once its step is passed.
    assert fill.state_dict(consumed=3)["owed"] == [[0, [0], 7], [1, [2], 8], [2, [4, 5], 9]]


def test_a_resumed_fill_sends_the_owed_rows_and_skips_the_rows_trained_ahead():
    state = {"owed": [[0, [0], 7]], "ahead": [[1, [3]], [4, [8]]]}
    fill = CompletionFill(batch_size=2, resume=state)
    assert fill.resumed_owed == [(0, [0], 7)]
    assert fill.to_send(1, [2, 3]) == [2]
    assert fill.to_send(2, [4, 5]) == [4, 5]
    fill.sent(1, 1, [2], agent_seed=8)
    # Saved again before step 4 was sent, and before the owed rows went out: both are kept.
    again = fill.state_dict(consumed=1)
    assert again["owed"] == [[0, [0], 7]]
    assert [4, [8]] in again["ahead"] and [1, [3]] in again["ahead"]
    # A step whose rows were all trained ahead is sent empty, closed at once.
    assert fill.to_send(4, [8]) == []
    fill.sent(4, 4, [], agent_seed=None)
    assert fill.requests[4].closed


def test_a_later_step_trained_whole_ahead_is_remembered_until_the_loop_passes_it():
    fill = CompletionFill(batch_size=2)
    fill.sent(0, 0, [0, 1], agent_seed=7)
    fill.sent(1, 1, [2, 3], agent_seed=8)
    fill.closed(1, [group(2), group(3)], {})  # step 1's batch finished first, whole
    fill.take(0)  # step 0 trains it
    # Saved after step 0: step 1's rows must not be rolled out again after a resume.
    assert fill.state_dict(consumed=1) == {"owed": [[0, [0, 1], 7]], "ahead": [[1, [2, 3]]]}
    fill.closed(0, [group(0), group(1)], {})
    fill.take(1)
    assert fill.requests == {}
    assert fill.state_dict(consumed=2) == {"owed": [], "ahead": []}

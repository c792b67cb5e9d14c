"""Rewards on multi-turn records, reading turns out of messages, and replaying games."""

from __future__ import annotations

import json
from typing import Any

import pytest
from areno_recipes_agentic.duelgrid.episode import (
    play_round,
    read_choice,
    replay,
    round_entries,
    score_episode,
)
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.duelgrid.rules import Rules, state_from_map, state_to_dict
from areno_recipes_agentic.duelgrid.turn import score_turn
from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn
from areno_recipes_agentic.toolcalls import AssistantTurn, assistant_turns, message_turn

from areno_core.types import RewardRecord

WIN_NOW = "XX.OO...."  # X to move: 3 wins now, 6 draws, 1 is taken
ARENA = [".....", ".A.U.", ".^...", ".....", "....."]
STRIKE = [{"type": "MOVE", "direction": "right"}, {"type": "ATTACK"}]
ATTACK = [{"type": "ATTACK"}]
SLOW = Rules(energy_per_turn=1)  # U (starting at 0 energy) never affords an attack


def _assistant(name: str, arguments: Any, content: str = "") -> dict[str, Any]:
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": content, "tool_calls": [call]}


def _conversation(*assistants: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "play"},
    ]
    for message in assistants:
        messages += [message, {"role": "tool", "tool_call_id": "c", "content": "result"}]
    return messages


def _square(square: Any) -> dict[str, Any]:
    return _assistant("choose_square", json.dumps({"square": square}))


@pytest.mark.parametrize(
    ("squares", "expected"),
    [
        ((3, 1), 1.0),  # the first move is legal: later messages are ignored
        ((1, 3), 0.5),  # one failed attempt, then optimal
        ((1, 6), 0.15),  # one failed attempt, then a draw (0.3)
        ((1, 1, 3), 0.25),  # two failed attempts
        ((1, "x"), 0.0),  # never legal
    ],
)
def test_tictactoe_reward_multi_turn_retry_discount(
    squares: tuple[Any, ...], expected: float
) -> None:
    record = RewardRecord(
        prompt="p",
        completion="",
        messages=_conversation(*(_square(s) for s in squares)),
        row={"board": WIN_NOW},
    )
    assert tictactoe_reward_fn(record) == pytest.approx(expected)


def test_tictactoe_reward_multi_turn_text_mode_reads_each_message() -> None:
    messages = [
        {"role": "user", "content": "play"},
        {"role": "assistant", "content": "<move>1</move>"},
        {"role": "user", "content": "taken"},
        {"role": "assistant", "content": "<think><move>7</move></think><move>3</move>"},
    ]
    record = RewardRecord(
        prompt="p", completion="", messages=messages, row={"board": WIN_NOW, "mode": "text"}
    )
    assert tictactoe_reward_fn(record) == 0.5


def test_assistant_turns_last_message_calls_taken_from_record_tool_calls() -> None:
    first = _square(1)
    last = {"role": "assistant", "content": "plain text"}
    flat = [first["tool_calls"][0], {"name": "choose_square", "arguments": {"square": 3}}]
    record = RewardRecord(
        prompt="p",
        completion="",
        messages=[{"role": "user", "content": "x"}, first, last],
        tool_calls=flat,
        row={"board": WIN_NOW},
    )
    turns = assistant_turns(record)
    assert turns is not None and len(turns) == 2
    assert turns[1].tool_calls == ({"name": "choose_square", "arguments": {"square": 3}},)
    assert tictactoe_reward_fn(record) == 0.5


def test_assistant_turns_single_assistant_message_none() -> None:
    record = RewardRecord(prompt="p", completion="", messages=[_square(3)])
    assert assistant_turns(record) is None
    assert assistant_turns(RewardRecord(prompt="p", completion="")) is None


def test_assistant_turns_one_reply_with_results_after_it_multi_turn() -> None:
    messages = _conversation(_square(3))  # the reply is followed by its tool result
    turns = assistant_turns(RewardRecord(prompt="p", completion="", messages=messages))
    assert turns is not None and len(turns) == 1


def test_message_turn_tagged_tool_calls_in_content_parsed() -> None:
    content = (
        'Let me act.\n<tool_call>{"name": "choose_action", "arguments": {"actions": '
        '[{"type": "ATTACK"}]}}</tool_call>\n<tool_call>{broken</tool_call>'
    )
    turn = message_turn({"role": "assistant", "content": content})
    assert turn.tool_calls == (
        {"name": "choose_action", "arguments": {"actions": [{"type": "ATTACK"}]}},
    )
    assert read_choice(turn).actions == ({"type": "ATTACK"},)


def test_read_choice_tool_mode_text_fallback_half_factor() -> None:
    turn = AssistantTurn(tool_calls=(), text=json.dumps({"actions": STRIKE}))
    choice = read_choice(turn, "tool")
    assert (choice.source, choice.factor, choice.actions) == ("text", 0.5, tuple(STRIKE))
    assert read_choice(turn, "text").factor == 1.0
    assert read_choice(AssistantTurn((), "no json"), "tool").actions is None


def test_duelgrid_reward_multi_turn_mean_of_turn_scores() -> None:
    start = state_from_map(ARENA, user={"energy": 0}, rules=SLOW)
    after_first = play_round(start, STRIKE).after
    messages = _conversation(
        _assistant("choose_action", {"actions": STRIKE}),
        _assistant("choose_action", json.dumps({"actions": ATTACK})),
    )
    record = RewardRecord(
        prompt="p", completion="", messages=messages, row={"state": state_to_dict(start)}
    )
    expected = (score_turn(start, STRIKE).total + score_turn(after_first, ATTACK).total) / 2
    assert duelgrid_reward_fn(record) == pytest.approx(expected)
    assert 0.0 < expected <= 1.0


def test_score_episode_unreadable_turn_zero_and_does_nothing() -> None:
    start = state_from_map(ARENA, user={"energy": 0})
    turns = [AssistantTurn((), "no idea"), AssistantTurn((), json.dumps({"actions": STRIKE}))]
    result = score_episode(start, turns, "tool")
    assert result.turn_scores[0] == 0.0
    assert result.rounds[0].agent_events == ()
    # the second turn starts where A stood: nothing moved on its first turn
    assert result.rounds[1].before.agent.pos == start.agent.pos
    assert result.turn_scores[1] == pytest.approx(
        score_turn(result.rounds[1].before, STRIKE).total * 0.5
    )


def test_score_episode_loss_in_reply_adds_zero_turn() -> None:
    # A at 3 hp ends its turn next to U, which has full energy and attacks twice
    start = state_from_map(ARENA, agent={"hp": 3})
    result = score_episode(start, [AssistantTurn((), json.dumps({"actions": STRIKE[:1]}))], "text")
    assert result.rounds[0].lost_in_reply
    assert result.final.winner == "U"
    assert result.turn_scores == (pytest.approx(score_turn(start, STRIKE[:1]).total), 0.0)


def test_score_episode_replies_after_game_over_ignored() -> None:
    start = state_from_map(ARENA, user={"hp": 3})
    turns = [AssistantTurn((), json.dumps({"actions": STRIKE}))] * 3
    result = score_episode(start, turns, "text")
    assert len(result.rounds) == 1 and result.final.winner == "A"


def test_replay_round_entries_same_states_as_rounds() -> None:
    state = state_from_map(ARENA, user={"energy": 0}, rules=SLOW)
    entries: list[dict[str, Any]] = []
    states = []
    for actions in (STRIKE, [*ATTACK, {"type": "FLY"}, *ATTACK], []):
        played = play_round(state, actions)
        entries += round_entries(played)
        state = played.after
        states.append(state)
    frames = replay(state_from_map(ARENA, user={"energy": 0}, rules=SLOW), entries)
    assert entries[2] == {"unit": "A", "actions": [*ATTACK, {"type": "FLY"}]}  # cut at rejection
    assert [f.unit for f in frames] == ["A", "U", "A", "U", "A", "U"]
    assert frames[-1].state == states[-1]


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([{"unit": "U", "actions": []}], "A's turn"),
        ([{"unit": "B", "actions": []}], "'unit'"),
        ([{"unit": "A", "actions": "ATTACK"}], "'actions'"),
        (["oops"], "object"),
    ],
)
def test_replay_bad_entry_value_error(entries: list[Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        replay(state_from_map(ARENA), entries)

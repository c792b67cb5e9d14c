"""The tictactoe and duelgrid agents against a scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from areno_recipes_agentic.duelgrid.agent import run_agent as duelgrid_agent
from areno_recipes_agentic.duelgrid.episode import play_round, replay
from areno_recipes_agentic.duelgrid.loader import duelgrid_loader
from areno_recipes_agentic.duelgrid.reward import duelgrid_reward_fn
from areno_recipes_agentic.duelgrid.rules import (
    GameState,
    state_from_dict,
    state_from_map,
    state_to_dict,
    state_to_text,
)
from areno_recipes_agentic.duelgrid.turn import score_turn
from areno_recipes_agentic.tictactoe.agent import run_agent as tictactoe_agent
from areno_recipes_agentic.tictactoe.agent import run_agent_with_retry
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader
from areno_recipes_agentic.tictactoe.reward import tictactoe_reward_fn
from areno_recipes_agentic.tictactoe.tools import choose_square_tool

from areno_core.agentic.types import (
    AgentBatch,
    AgentContext,
    AgentFailure,
    AgentItem,
    AgentTrajectory,
    AgentTrajectoryTurn,
)
from areno_core.types import RewardRecord

WIN_NOW = "XX.OO...."  # X to move: 3 wins now
ARENA = [".....", ".A.U.", ".^...", ".....", "....."]  # A (1,1), U (1,3), trap below A
STRIKE = [{"type": "MOVE", "direction": "right"}, {"type": "ATTACK"}]


def _batch(rows: Sequence[Mapping[str, Any]], n_samples: int = 1) -> AgentBatch:
    items = tuple(
        AgentItem(row=row, messages=tuple(row["prompt"]), prompt_index=i, sample_index=s)
        for i, row in enumerate(rows)
        for s in range(n_samples)
    )
    return AgentBatch(items=items, n_samples=n_samples)


def _ctx(server: Any, **kwargs: Any) -> AgentContext:
    return AgentContext(base_url=server.base_url, api_key="sk-test", model="policy", **kwargs)


def _run(agent: Callable[..., Any], ctx: AgentContext, batch: AgentBatch) -> list[Any]:
    return asyncio.run(agent(ctx, batch))


def _square(square: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "choose_square", "arguments": json.dumps({"square": square})},
        }
        return {"tool_calls": [call]}

    return reply


def _final_record(result: Any) -> RewardRecord:
    """A reward record as the core builds it from a returned turn or trajectory."""
    if isinstance(result, AgentTrajectoryTurn):
        message = result.response.choices[0].message.model_dump(exclude_none=True)
        return RewardRecord(
            prompt="p",
            completion=message.get("content") or "",
            messages=[*result.messages, message],
            tool_calls=message.get("tool_calls", []),
            row=result.item.row,
        )
    assert isinstance(result, AgentTrajectory)
    return RewardRecord(
        prompt="p", completion="", messages=list(result.messages), row=result.item.row
    )


# -- tic-tac-toe ------------------------------------------------------------------------------


def test_tictactoe_agent_single_turn_one_turn_per_sample(fake_openai: Any) -> None:
    server = fake_openai(_square(3))
    rows = [tictactoe_loader({"board": WIN_NOW}), tictactoe_loader({"board": "X...O...."})]
    batch = _batch(rows, n_samples=2)
    results = _run(tictactoe_agent, _ctx(server), batch)

    assert len(results) == 4
    for result, item in zip(results, batch.iter_samples(), strict=True):
        assert isinstance(result, AgentTrajectoryTurn)
        assert result.item is item
        assert list(result.messages) == list(item.messages)
        call = result.response.choices[0].message.tool_calls[0]
        assert call.function.name == "choose_square"
    assert len(server.requests) == 4
    for body, headers in zip(server.requests, server.headers, strict=True):
        assert body["model"] == "policy"
        assert body["tools"] == [choose_square_tool()]
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
        assert headers["authorization"] == "Bearer sk-test"
    # square 3 wins on the first board: the reward scores the returned turn 1.0
    assert tictactoe_reward_fn(_final_record(results[0])) == 1.0


def test_tictactoe_agent_sends_the_rows_tools_and_tool_choice(fake_openai: Any) -> None:
    server = fake_openai(_square(3))
    rows = [
        tictactoe_loader({"board": WIN_NOW, "style": "compact", "tool_choice": "choose_square"}),
        tictactoe_loader({"board": WIN_NOW, "tool_choice": "required"}),
        tictactoe_loader({"board": WIN_NOW}),
    ]
    _run(tictactoe_agent, _ctx(server), _batch(rows))
    # the three episodes run concurrently: requests arrive in any order, so match by content
    assert len(server.requests) == 3
    by_choice = {repr(body.get("tool_choice")): body for body in server.requests}
    forced = by_choice[repr({"type": "function", "function": {"name": "choose_square"}})]
    required = by_choice["'required'"]
    plain = by_choice["None"]
    assert forced["tools"] == [choose_square_tool(compact=True)]
    assert forced["tool_choice"] == {"type": "function", "function": {"name": "choose_square"}}
    assert required["tool_choice"] == "required"
    assert "tool_choice" not in plain


def test_tictactoe_agent_text_mode_sends_no_tools(fake_openai: Any) -> None:
    server = fake_openai(lambda body: {"content": "<move>3</move>"})
    row = tictactoe_loader({"board": WIN_NOW, "mode": "text"})
    (result,) = _run(tictactoe_agent, _ctx(server), _batch([row]))
    assert "tools" not in server.requests[0]
    assert result.response.choices[0].message.content == "<move>3</move>"


def test_tictactoe_agent_illegal_move_with_retry_asks_again(fake_openai: Any) -> None:
    answers = iter([1, 3])  # square 1 is taken; 3 wins
    server = fake_openai(lambda body: _square(next(answers))(body))
    row = tictactoe_loader({"board": WIN_NOW, "retries": 1})
    (result,) = _run(tictactoe_agent, _ctx(server), _batch([row]))

    assert isinstance(result, AgentTrajectory)
    assert len(result.turns) == 2
    second = list(result.turns[1].messages)
    assert second[:2] == list(row["prompt"])
    assert second[2]["role"] == "assistant"
    assert second[2]["tool_calls"][0]["function"]["name"] == "choose_square"
    assert second[3]["role"] == "tool"
    assert second[3]["tool_call_id"] == "call_1"
    assert "Square 1 is not a free square" in second[3]["content"]
    assert "3, 6, 7, 8, 9" in second[3]["content"]
    assert server.requests[1]["messages"] == second
    # the whole conversation ends with the last reply; the retried winning move earns half
    assert list(result.messages[:-1]) == second
    assert result.messages[-1]["tool_calls"][0]["function"]["arguments"] == '{"square": 3}'
    assert tictactoe_reward_fn(_final_record(result)) == 0.5


def test_tictactoe_retry_agent_legal_first_move_single_turn(fake_openai: Any) -> None:
    server = fake_openai(_square(6))  # legal (draws), so no retry
    row = tictactoe_loader({"board": WIN_NOW})
    (result,) = _run(run_agent_with_retry, _ctx(server), _batch([row]))
    assert isinstance(result, AgentTrajectoryTurn)
    assert len(server.requests) == 1


def test_tictactoe_retry_agent_no_tool_call_user_feedback(fake_openai: Any) -> None:
    server = fake_openai(lambda body: {"content": "I pick 3"})
    row = tictactoe_loader({"board": WIN_NOW})
    (result,) = _run(run_agent_with_retry, _ctx(server), _batch([row]))
    assert isinstance(result, AgentTrajectory) and len(result.turns) == 2
    feedback = result.turns[1].messages[-1]
    assert feedback["role"] == "user"
    assert "did not call `choose_square`" in feedback["content"]


def test_tictactoe_agent_concurrency_limited_to_max(fake_openai: Any) -> None:
    server = fake_openai(_square(3), delay_s=0.15)
    rows = [tictactoe_loader({"board": WIN_NOW})]
    results = _run(tictactoe_agent, _ctx(server, max_concurrency=2), _batch(rows, n_samples=6))
    assert len(results) == 6
    assert server.max_active == 2


def test_tictactoe_agent_unreachable_endpoint_failure_per_sample() -> None:
    ctx = AgentContext(base_url="http://127.0.0.1:9/v1", api_key="k", timeout_s=5.0)
    row = tictactoe_loader({"board": WIN_NOW})
    results = _run(tictactoe_agent, ctx, _batch([row], n_samples=2))
    assert [type(r) for r in results] == [AgentFailure, AgentFailure]
    assert all(r.kind == "error" for r in results)


# -- DuelGrid ---------------------------------------------------------------------------------


def _actions(*turns: list[dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    queue = iter(turns)

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        actions = next(queue)
        call = {
            "id": f"call_{len(body['messages'])}",
            "type": "function",
            "function": {"name": "choose_action", "arguments": json.dumps({"actions": actions})},
        }
        return {"content": "", "tool_calls": [call]}

    return reply


def _duel_row(state: GameState, **extra: Any) -> dict[str, Any]:
    return duelgrid_loader({"id": "t", "state": state_to_dict(state), **extra})


def test_duelgrid_agent_two_rounds_tool_results_appended(fake_openai: Any) -> None:
    start = state_from_map(ARENA)
    server = fake_openai(_actions(STRIKE, [{"type": "ATTACK"}]))
    row = _duel_row(start, turns=2)
    (result,) = _run(duelgrid_agent, _ctx(server), _batch([row]))

    assert isinstance(result, AgentTrajectory)
    assert len(result.turns) == 2
    first_round = play_round(start, STRIKE)
    second = list(result.turns[1].messages)
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "user"]
    assert second[:2] == list(row["prompt"])
    assert second[3]["tool_call_id"] == "call_2"
    assert "A attacks U" in second[3]["content"]
    assert "U takes 3 damage" in second[3]["content"]
    assert "U played:" in second[4]["content"]
    assert state_to_text(first_round.after, viewer="A") in second[4]["content"]
    assert (
        "Your turn. Plan your whole turn, then call the `choose_action` tool"
        in second[4]["content"]
    )
    assert server.requests[1]["messages"] == second
    assert all(body["tools"][0]["function"]["name"] == "choose_action" for body in server.requests)

    # the whole conversation ends with the last reply's results
    roles = [m["role"] for m in result.messages]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool", "user"]
    assert "Your turn" not in result.messages[-1]["content"]

    # the game record replays to the state the agent reached
    game = result.metadata["game"]
    frames = replay(state_from_dict(game["state"]), game["turns"])
    second_round = play_round(first_round.after, [{"type": "ATTACK"}])
    assert frames[-1].state == second_round.after
    assert [t["unit"] for t in game["turns"]] == ["A", "U", "A", "U"]

    # U's second reply (two attacks) defeats A: the game is over and U won
    assert second_round.lost_in_reply
    assert result.metadata["winner"] == "U"
    assert "The game is over. Winner: U." in result.messages[-1]["content"]

    # the reward replays the same rounds and averages the turn scores, plus a 0 for the loss
    first_score = score_turn(start, STRIKE).total
    second_score = score_turn(first_round.after, [{"type": "ATTACK"}]).total
    expected = (first_score + second_score + 0.0) / 3
    assert duelgrid_reward_fn(_final_record(result)) == pytest.approx(expected)


def test_duelgrid_agent_text_reply_outcome_in_user_message(fake_openai: Any) -> None:
    text = "I step right and hit. " + json.dumps({"actions": STRIKE})
    server = fake_openai(lambda body: {"content": text})
    (result,) = _run(duelgrid_agent, _ctx(server), _batch([_duel_row(state_from_map(ARENA))]))
    assert isinstance(result, AgentTrajectory)  # default: 2 rounds
    second = list(result.turns[1].messages)
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert "read from your reply text" in second[3]["content"]
    assert "A attacks U" in second[3]["content"]


def test_duelgrid_agent_turns_one_single_turn(fake_openai: Any) -> None:
    server = fake_openai(_actions(STRIKE))
    row = _duel_row(state_from_map(ARENA), turns=1)
    (result,) = _run(duelgrid_agent, _ctx(server), _batch([row]))
    assert isinstance(result, AgentTrajectoryTurn)
    assert result.metadata["game"]["turns"][0] == {"unit": "A", "actions": STRIKE}
    assert duelgrid_reward_fn(_final_record(result)) == pytest.approx(0.6)


def test_duelgrid_agent_win_ends_game_early(fake_openai: Any) -> None:
    start = state_from_map(ARENA, user={"hp": 3})
    server = fake_openai(_actions(STRIKE, STRIKE, STRIKE))
    (result,) = _run(duelgrid_agent, _ctx(server), _batch([_duel_row(start, turns=3)]))
    assert len(server.requests) == 1
    assert isinstance(result, AgentTrajectory) and len(result.turns) == 1
    assert result.metadata["winner"] == "A"
    assert result.metadata["rounds"] == 1
    assert "The game is over. Winner: A." in result.messages[-1]["content"]
    assert duelgrid_reward_fn(_final_record(result)) == pytest.approx(
        score_turn(start, STRIKE).total
    )


def test_duelgrid_agent_loss_in_first_reply_scored_with_zero(fake_openai: Any) -> None:
    start = state_from_map(ARENA, agent={"hp": 3})  # U answers the strike with two attacks
    server = fake_openai(_actions(STRIKE, STRIKE))
    (result,) = _run(duelgrid_agent, _ctx(server), _batch([_duel_row(start, turns=2)]))
    assert len(server.requests) == 1
    assert isinstance(result, AgentTrajectory) and result.metadata["winner"] == "U"
    expected = (score_turn(start, STRIKE).total + 0.0) / 2
    assert duelgrid_reward_fn(_final_record(result)) == pytest.approx(expected)

"""Turning agent turns into one token row: spans, masks, logprobs, prefix reuse, rewrites."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from areno_core.agentic.records import ServedChoice, ServedCompletion
from areno_core.agentic.trajectory import (
    AgentTurnError,
    TurnTokens,
    build_trajectory,
    fill_logprobs,
    model_scorer,
    trajectory_record,
    turn_tokens,
)
from areno_core.agentic.types import AgentItem, AgentTrajectoryTurn
from areno_core.train.forward import token_logprobs_from_logits

ITEM = AgentItem(
    row={"id": 7},
    messages=({"role": "user", "content": "go"},),
    prompt_index=3,
    sample_index=1,
)
P1 = (1, 2, 3, 4)
C1 = (10, 11, 12)
C1_LP = (-0.1, -0.2, -0.3)
BRIDGE, TOOL, HEADER = (20,), (30, 31, 32), (40,)
P2 = P1 + C1 + BRIDGE + TOOL + HEADER
C2 = (50, 51)
C2_LP = (-0.5, -0.6)


def _span(role: str, start: int, end: int, index: int | None = None) -> dict[str, Any]:
    return {"role": role, "message_index": index, "start": start, "end": end}


def _turns(second_prompt: tuple[int, ...] = P2, spans: bool = True) -> list[TurnTokens]:
    first = TurnTokens(
        prompt_ids=P1,
        token_ids=C1,
        logprobs=C1_LP,
        finish_reason="stop",
        message={"role": "assistant", "content": None, "tool_calls": []},
        prompt_spans=(_span("user", 0, 3, 0), _span("generation_prompt", 3, 4)) if spans else (),
    )
    second_spans = (
        _span("user", 0, 3, 0),
        _span("generation_prompt", 3, 4),
        _span("assistant", 4, 8, 1),
        _span("tool", 8, 11, 2),
        _span("generation_prompt", 11, 12),
    )
    second = TurnTokens(
        prompt_ids=second_prompt,
        token_ids=C2,
        logprobs=C2_LP,
        finish_reason="stop",
        message={"role": "assistant", "content": "done"},
        prompt_spans=second_spans if spans else (),
        prefix_reused=True,
    )
    return [first, second]


def test_shared_prefix_appends_only_new_tokens_with_context_masked() -> None:
    trajectory = build_trajectory(_turns(), None, train_tool_results=False)
    assert trajectory.input_ids == [*P2, *C2]
    assert trajectory.loss_mask == [0] * 4 + [1] * 3 + [0] * 5 + [1] * 2
    assert trajectory.rollout_logprobs == [0.0] * 4 + list(C1_LP) + [0.0] * 5 + list(C2_LP)
    assert trajectory.prompt_len == 4
    assert trajectory.num_action_tokens == 5
    meta = trajectory.metadata
    assert (meta["turns"], meta["history_rewrites"], meta["dropped_action_tokens"]) == (2, 0, 0)
    assert meta["tool_positions"] == [] and meta["prefix_reused"] == 1


def test_train_tool_results_unmasks_only_tool_span() -> None:
    trajectory = build_trajectory(_turns(), None, train_tool_results=True)
    assert trajectory.loss_mask == [0] * 4 + [1] * 3 + [0] + [1] * 3 + [0] + [1] * 2
    assert trajectory.metadata["tool_positions"] == [8, 9, 10]
    assert trajectory.rollout_logprobs[8:11] == [0.0, 0.0, 0.0]


def test_fill_logprobs_replaces_tool_placeholders_only() -> None:
    trajectory = build_trajectory(_turns(), None, train_tool_results=True)
    before = list(trajectory.rollout_logprobs)

    def score(rows: list[list[int]], positions: list[list[int]]) -> list[list[float]]:
        assert rows == [trajectory.input_ids] and positions == [[8, 9, 10]]
        return [[-float(p) for p in ps] for ps in positions]

    assert fill_logprobs([trajectory], score) == 3
    assert trajectory.rollout_logprobs[8:11] == [-8.0, -9.0, -10.0]
    untouched = [i for i in range(len(before)) if i not in (8, 9, 10)]
    assert [trajectory.rollout_logprobs[i] for i in untouched] == [before[i] for i in untouched]


def test_rewritten_history_cuts_row_to_common_prefix() -> None:
    rewritten = (1, 2, 99, 98)
    trajectory = build_trajectory(_turns(rewritten, spans=False), None, train_tool_results=False)
    assert trajectory.input_ids == [1, 2, 99, 98, *C2]
    assert trajectory.loss_mask == [0, 0, 0, 0, 1, 1]
    assert trajectory.rollout_logprobs == [0.0] * 4 + list(C2_LP)
    assert trajectory.prompt_len == 2
    assert trajectory.metadata["history_rewrites"] == 1
    assert trajectory.metadata["dropped_action_tokens"] == 3


def test_history_diverging_inside_completion_keeps_earlier_sampled_tokens() -> None:
    diverged = (*P1, C1[0], 77, 78)
    trajectory = build_trajectory(_turns(diverged, spans=False), None, train_tool_results=False)
    assert trajectory.input_ids == [*P1, C1[0], 77, 78, *C2]
    assert trajectory.loss_mask == [0, 0, 0, 0, 1, 0, 0, 1, 1]
    assert trajectory.rollout_logprobs[4] == C1_LP[0]
    assert trajectory.metadata["dropped_action_tokens"] == 2
    assert trajectory.prompt_len == 4


def test_three_turns_row_equals_last_prompt_plus_completion() -> None:
    first, second = _turns()
    p3 = (*P2, *C2, 60, 61)
    third = TurnTokens(p3, (70,), (-0.7,), "length", {"role": "assistant", "content": "x"})
    trajectory = build_trajectory([first, second, third], None, train_tool_results=False)
    assert trajectory.input_ids == [*p3, 70]
    assert trajectory.num_action_tokens == len(C1) + len(C2) + 1
    assert trajectory.finish_reason == "length"


def _response(ext: dict[str, Any] | None, rid: str = "chatcmpl-1") -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "hi"},
        "finish_reason": "stop",
    }
    if ext is not None:
        choice["areno"] = ext
    return {"id": rid, "object": "chat.completion", "choices": [choice]}


def test_turn_tokens_from_dict_response_reads_extension() -> None:
    ext = {
        "prompt_token_ids": [1, 2],
        "token_ids": [3],
        "logprobs": [-1.0],
        "finish_reason": "stop",
    }
    turn = AgentTrajectoryTurn(item=ITEM, messages=[], response=_response(ext))
    view = turn_tokens(turn)
    assert (view.prompt_ids, view.token_ids, view.logprobs) == ((1, 2), (3,), (-1.0,))
    assert view.response_id == "chatcmpl-1"


def test_turn_tokens_without_extension_uses_server_record() -> None:
    choice = ServedChoice(
        index=0,
        message={"role": "assistant", "content": "hi"},
        finish_reason="stop",
        prompt_token_ids=(5, 6),
        token_ids=(7, 8),
        logprobs=(-0.5, -0.5),
        engine_finish_reason="stop",
    )
    record = ServedCompletion("chatcmpl-9", 0, "policy", (), (), (choice,))
    turn = AgentTrajectoryTurn(item=ITEM, messages=[], response=_response(None, "chatcmpl-9"))
    assert turn_tokens(turn, {"chatcmpl-9": record}).token_ids == (7, 8)
    with pytest.raises(AgentTurnError, match="no 'areno' token data"):
        turn_tokens(turn)


def test_turn_tokens_with_bad_choice_index_raises() -> None:
    turn = AgentTrajectoryTurn(item=ITEM, messages=[], response=_response({}), choice_index=2)
    with pytest.raises(AgentTurnError, match="choice_index 2"):
        turn_tokens(turn)


def test_build_trajectory_without_turns_raises() -> None:
    with pytest.raises(AgentTurnError, match="at least one turn"):
        build_trajectory([], None, train_tool_results=False)


def test_spanless_turn_locates_tool_result_by_text(byte_tokenizer: Any) -> None:
    encode = lambda text: tuple(byte_tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    p1, c1 = encode("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n"), encode("call")
    p2 = p1 + c1 + encode("\n<|im_start|>tool\n<tool_response>RESULT</tool_response>")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    sent = [{"role": "user", "content": "go"}]
    history = [*sent, {"role": "assistant", "content": "", "tool_calls": [call]}]
    messages = [*history, {"role": "tool", "tool_call_id": "c1", "content": "RESULT"}]
    turns = [
        AgentTrajectoryTurn(
            ITEM,
            sent,
            _response(
                {"prompt_token_ids": list(p1), "token_ids": list(c1), "logprobs": [-1.0] * len(c1)}
            ),
        ),
        AgentTrajectoryTurn(
            ITEM,
            messages,
            _response({"prompt_token_ids": list(p2), "token_ids": [65], "logprobs": [-1.0]}),
        ),
    ]
    trajectory = build_trajectory(turns, byte_tokenizer, train_tool_results=True)
    flagged = [trajectory.input_ids[i] for i in trajectory.metadata["tool_positions"]]
    assert byte_tokenizer.decode(flagged) == "RESULT"


def test_trajectory_record_collects_messages_calls_and_trace(byte_tokenizer: Any) -> None:
    encode = lambda text: list(byte_tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    first_ext = {
        "prompt_token_ids": encode("P:"),
        "token_ids": [*encode("call"), 258],
        "logprobs": [-1.0] * 5,
    }
    head = first_ext["prompt_token_ids"] + first_ext["token_ids"]
    second_ext = {
        "prompt_token_ids": [*head, *encode("T:")],
        "token_ids": [*encode("answer 4"), 258],
        "logprobs": [-1.0] * 9,
    }
    first = _response(first_ext, "r1")
    first["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    second = _response(second_ext, "r2")
    sent = [{"role": "user", "content": "go"}]
    messages = [
        *sent,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    turns = [AgentTrajectoryTurn(ITEM, sent, first), AgentTrajectoryTurn(ITEM, messages, second)]
    trajectory = build_trajectory(turns, byte_tokenizer, train_tool_results=False)
    record = trajectory_record(
        trajectory, turns, byte_tokenizer, item=ITEM, answer="4", metadata={"game": "x"}
    )
    assert record.prompt == "P:"
    assert record.completion == "answer 4"
    assert record.tool_calls == [call]
    assert record.tool_results == [{"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    assert [m["role"] for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    assert record.messages[-1] == {"role": "assistant", "content": "hi"}
    assert record.token_ids == tuple(trajectory.input_ids[2:])
    assert record.loss_mask == tuple(trajectory.loss_mask[2:])
    assert (record.row, record.prompt_index, record.sample_index, record.answer) == (
        {"id": 7},
        3,
        1,
        "4",
    )
    assert record.metadata["game"] == "x" and record.metadata["turns"] == 2
    assert [t["response_id"] for t in record.metadata["trace"]] == ["r1", "r2"]
    assert record.metadata["trace"][0]["tool_calls"] == [call]


def test_model_scorer_matches_a_plain_forward_pass(tiny_policy: Any) -> None:
    model, _tokenizer, _ = tiny_policy
    rows = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [4, 4, 4, 4]]
    positions = [[2, 5, 3], [1, 2], [0, 3]]
    scored = model_scorer(model, temperature=0.7, max_batch_tokens=8)(rows, positions)
    for row, wanted, values in zip(rows, positions, scored, strict=True):
        ids = torch.tensor([row])
        with torch.no_grad():
            expected = token_logprobs_from_logits(model(input_ids=ids).logits, ids, 0.7)[0]
        torch.testing.assert_close(torch.tensor(values), expected[wanted], atol=1e-5, rtol=1e-5)

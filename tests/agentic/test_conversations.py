"""Splitting one sample's served choices into linear conversations (hand-made records)."""

from __future__ import annotations

from areno_core.agentic.conversations import conversation_paths, untrained_spans
from areno_core.agentic.records import ServedChoice, ServedCompletion


def _record(rid: str, *choices: tuple[tuple[int, ...], tuple[int, ...]]) -> ServedCompletion:
    served = tuple(
        ServedChoice(
            index=i,
            message={"role": "assistant", "content": ""},
            finish_reason="stop",
            prompt_token_ids=prompt,
            token_ids=tokens,
            logprobs=(-1.0,) * len(tokens),
            engine_finish_reason="stop",
        )
        for i, (prompt, tokens) in enumerate(choices)
    )
    return ServedCompletion(rid, 0, "policy", (), (), served, sample=(0, 0))


def _ids(paths) -> list[list[tuple[str, int]]]:
    return [[(n.response_id, n.choice_index) for n in path] for path in paths]


def test_linear_conversation_is_one_path() -> None:
    records = [
        _record("a", ((1, 2), (3, 4))),
        _record("b", ((1, 2, 3, 4, 5), (6,))),
        _record("c", ((1, 2, 3, 4, 5, 6, 7), (8, 9))),
    ]
    paths = conversation_paths(records)
    assert _ids(paths) == [[("a", 0), ("b", 0), ("c", 0)]]
    assert [(n.prompt_len, n.length) for n in paths[0]] == [(2, 4), (5, 6), (7, 9)]
    assert untrained_spans(paths) == [[]]


def test_parallel_calls_from_one_state_branch_and_share_the_prefix_once() -> None:
    # a; then b and c both continue a (two calls sent in parallel); then d continues c.
    records = [
        _record("a", ((1,), (2, 3))),
        _record("b", ((1, 2, 3, 9), (4,))),
        _record("c", ((1, 2, 3, 8), (5,))),
        _record("d", ((1, 2, 3, 8, 5, 7), (6,))),
    ]
    paths = conversation_paths(records)
    assert _ids(paths) == [[("a", 0), ("b", 0)], [("a", 0), ("c", 0), ("d", 0)]]
    # a's tokens (positions 1..3) were trained in the first row; context in the second.
    assert untrained_spans(paths) == [[], [(1, 3)]]


def test_unrelated_prompt_and_rewritten_history_start_new_rows() -> None:
    records = [
        _record("a", ((1, 2), (3,))),
        _record("sub", ((7, 7), (8,))),  # a sub-agent with a prompt of its own
        _record("b", ((1, 2, 4), (5,))),  # drops a's reply: continues nothing exactly
    ]
    assert _ids(conversation_paths(records)) == [[("a", 0)], [("sub", 0)], [("b", 0)]]


def test_n_choices_are_siblings_and_the_continued_one_extends() -> None:
    records = [
        _record("a", ((1,), (2,)), ((1,), (3,))),
        _record("b", ((1, 3, 4), (5,))),
    ]
    paths = conversation_paths(records)
    assert _ids(paths) == [[("a", 0)], [("a", 1), ("b", 0)]]
    assert untrained_spans(paths) == [[], []]


def test_longest_exact_prefix_wins() -> None:
    records = [
        _record("a", ((1,), (2,))),
        _record("b", ((1, 2), (3,))),
        _record("c", ((1, 2, 3), (4,))),
    ]
    # c's prompt starts with both a's and b's rows; b's is longer, so c continues b.
    assert _ids(conversation_paths(records)) == [[("a", 0), ("b", 0), ("c", 0)]]

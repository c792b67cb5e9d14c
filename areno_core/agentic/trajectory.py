"""Turn the chat-completion turns of one agentic sample into one training row.

Every turn names a response of the endpoint, whose record holds the exact prompt token ids the
engine ran and the tokens it sampled with their logprobs. The row is built from those records,
never from the agent's copy of the token data (a copy that differs from the record makes the
turn, and so its sample, invalid: :class:`TurnMismatchError`). The row is built turn by turn:

* it starts with the first turn's prompt (mask 0);
* each turn's sampled tokens are appended with mask 1 and their rollout logprobs;
* the next turn's prompt normally starts with the row so far (the endpoint reuses the exact
  tokens of earlier completions); only its new part is appended, mask 0 (end-of-turn text,
  tool results, other messages, the next assistant header);
* when it does not (the agent rewrote or dropped history), the row is cut back to the longest
  common prefix with that prompt and continues from there. Everything after the cut leaves the
  row, sampled tokens included (counted in ``metadata["dropped_action_tokens"]``), so each
  remaining token sits in exactly the context it was sampled in and importance ratios stay
  exact. The row therefore always equals the last turn's prompt followed by its completion.

With ``train_tool_results``, the tokens of tool messages appended after the first turn get mask
1 too. They were not sampled, so they have no rollout logprob: their positions are listed in
``metadata["tool_positions"]`` with logprob 0.0 as a placeholder, and
:func:`fill_logprobs` scores them with the policy (``collect_agentic_groups`` does this), so
their importance ratio starts at 1.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from areno_core.agentic.records import ServedChoice, ServedCompletion
from areno_core.agentic.types import AgentItem, AgentTrajectoryTurn
from areno_core.errors import UserCodeError
from areno_core.log import get_logger, warn_once
from areno_core.types import RewardRecord, Trajectory

logger = get_logger(__name__)

# Longest appended segment searched by text when a turn carries no prompt spans.
_MAX_TEXT_SEARCH_TOKENS = 1024


class AgentTurnError(UserCodeError):
    """A turn returned by an agent cannot be turned into tokens."""


class TurnMismatchError(AgentTurnError):
    """A turn does not match what the endpoint served: an unknown response, or token data that
    differs from the endpoint's record of it. The sample is dropped, not trained on."""


@attrs.frozen
class TurnTokens:
    """The token view of one turn: what the engine ran and what it sampled."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    message: Mapping[str, Any]
    prompt_spans: tuple[Mapping[str, Any], ...] = ()
    response_id: str | None = None
    prefix_reused: bool = False
    choice_index: int = 0


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dict(dump())
    raise AgentTurnError(
        "a turn's response must be the endpoint's chat.completion (object or dict), one of "
        f"its stream chunks, or its id; got {type(value).__name__}"
    )


def response_reference(turn: AgentTrajectoryTurn) -> tuple[str | None, Mapping[str, Any] | None]:
    """``(response id, the agent's copy of the choice)`` of a turn; the copy is None when the
    turn gives only the id (a string) or a stream chunk without that choice."""
    response = turn.response
    if isinstance(response, str):
        return response, None
    data = _as_dict(response)
    rid = data.get("id")
    choices = [_as_dict(c) for c in data.get("choices") or ()]
    chosen = [c for c in choices if c.get("index") == turn.choice_index]
    if not chosen and data.get("object") != "chat.completion.chunk":
        if not 0 <= turn.choice_index < len(choices):
            raise AgentTurnError(
                f"turn of sample {turn.item.key}: choice_index {turn.choice_index} but the "
                f"response has {len(choices)} choice(s)"
            )
        chosen = [choices[turn.choice_index]]
    return (str(rid) if rid is not None else None), (chosen[0] if chosen else None)


def _copy_problem(copy: Mapping[str, Any], served: ServedChoice) -> str | None:
    """How the agent's ``areno`` data differs from the record (None: it does not)."""
    fields = (
        ("prompt_token_ids", served.prompt_token_ids),
        ("token_ids", served.token_ids),
        ("logprobs", served.logprobs),
    )
    for name, recorded in fields:
        given = copy.get(name)
        if given is None:
            continue
        try:
            same = tuple(given) == tuple(recorded)
        except TypeError:
            same = False
        if not same:
            return f"its '{name}' differ from what the endpoint served"
    return None


def turn_tokens(
    turn: AgentTrajectoryTurn, records: Mapping[str, ServedCompletion] | None = None
) -> TurnTokens:
    """The tokens of one turn.

    With ``records`` (the endpoint's records by response id, as ``collect_agentic_groups``
    passes them), the tokens come from the record of the turn's response, never from the
    agent's copy; a response the endpoint did not serve, or an ``areno`` copy whose token ids
    or logprobs differ from the record, raises :class:`TurnMismatchError`. Without
    ``records`` the response's ``areno`` field is read as is (for tests and offline use).
    """
    rid, copy = response_reference(turn)
    index = turn.choice_index
    extension = copy.get("areno") if copy is not None else None
    if records is not None:
        record = records.get(str(rid)) if rid is not None else None
        if record is None:
            raise TurnMismatchError(
                f"turn of sample {turn.item.key}: response {rid!r} was not served by this "
                "step's endpoint"
            )
        if not 0 <= index < len(record.choices):
            raise TurnMismatchError(
                f"turn of sample {turn.item.key}: choice_index {index} but response {rid!r} "
                f"had {len(record.choices)} choice(s)"
            )
        served = record.choices[index]
        if isinstance(extension, Mapping):
            problem = _copy_problem(extension, served)
            if problem is not None:
                raise TurnMismatchError(
                    f"turn of sample {turn.item.key}: response {rid!r} was changed: {problem}"
                )
        return served_turn_tokens(served, rid)
    if not isinstance(extension, Mapping):
        raise AgentTurnError(
            f"turn of sample {turn.item.key}: the response carries no 'areno' token data; "
            "return the response object the areno endpoint sent"
        )
    ext = dict(extension)
    tokens = tuple(int(t) for t in ext.get("token_ids", ()))
    logprobs = tuple(float(x) for x in ext.get("logprobs", ()))
    prompt = tuple(int(t) for t in ext.get("prompt_token_ids", ()))
    if len(tokens) != len(logprobs) or not prompt:
        raise AgentTurnError(
            f"turn of sample {turn.item.key}: malformed 'areno' data ({len(prompt)} prompt "
            f"tokens, {len(tokens)} tokens, {len(logprobs)} logprobs)"
        )
    message = copy.get("message") if copy is not None else None
    return TurnTokens(
        prompt_ids=prompt,
        token_ids=tokens,
        logprobs=logprobs,
        finish_reason=str(ext.get("finish_reason") or (copy or {}).get("finish_reason") or "stop"),
        message=_as_dict(message) if message is not None else {"role": "assistant"},
        prompt_spans=tuple(dict(s) for s in ext.get("prompt_spans") or ()),
        response_id=rid,
        prefix_reused=bool(ext.get("prefix_reused", False)),
        choice_index=index,
    )


def served_turn_tokens(choice: ServedChoice, response_id: str | None = None) -> TurnTokens:
    """:class:`TurnTokens` straight from an endpoint record."""
    return TurnTokens(
        choice_index=choice.index,
        prompt_ids=choice.prompt_token_ids,
        token_ids=choice.token_ids,
        logprobs=choice.logprobs,
        finish_reason=choice.engine_finish_reason,
        message=dict(choice.message),
        prompt_spans=choice.prompt_spans,
        response_id=response_id,
        prefix_reused=choice.prefix_reused,
    )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _span_roles(spans: Sequence[Mapping[str, Any]], start: int, end: int) -> list[str | None]:
    """The role of each prompt position in ``[start, end)`` according to ``spans``."""
    roles: list[str | None] = [None] * (end - start)
    for span in spans:
        lo, hi = max(int(span["start"]), start), min(int(span["end"]), end)
        for position in range(lo, hi):
            roles[position - start] = str(span.get("role"))
    return roles


def _tool_flags_by_text(
    tokenizer: Any, segment: Sequence[int], tool_texts: Sequence[str]
) -> list[bool]:
    """Fallback for turns without prompt spans: flag the tokens of ``segment`` whose text
    overlaps one of ``tool_texts`` (searched in order in the decoded segment)."""
    flags = [False] * len(segment)
    if not tool_texts or not segment or len(segment) > _MAX_TEXT_SEARCH_TOKENS:
        return flags
    ends = [len(tokenizer.decode(list(segment[: i + 1]))) for i in range(len(segment))]
    text = tokenizer.decode(list(segment))
    cursor = 0
    for wanted in tool_texts:
        found = text.find(wanted, cursor) if wanted else -1
        if found < 0:
            continue
        cursor = found + len(wanted)
        begin = 0
        for i, end in enumerate(ends):
            if end > found and begin < cursor:
                flags[i] = True
            begin = end
    return flags


def _tool_texts(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    texts = []
    for message in messages:
        if message.get("role") == "tool":
            content = message.get("content")
            texts.append(content if isinstance(content, str) else json.dumps(content))
    return texts


def build_trajectory(
    turns: Sequence[AgentTrajectoryTurn | TurnTokens],
    tokenizer: Any,
    *,
    train_tool_results: bool,
    records: Mapping[str, ServedCompletion] | None = None,
    reward: float = 0.0,
) -> Trajectory:
    """One token row for the turns of one sample, in order (see the module docstring).

    ``turns`` are :class:`AgentTrajectoryTurn` objects (or already read :class:`TurnTokens`).
    ``tokenizer`` is only used to locate tool results by text in turns whose prompts carry no
    spans. ``metadata`` of the result: ``turns``, ``history_rewrites``,
    ``dropped_action_tokens``, ``tool_positions`` (trainable tool-result positions, see
    :func:`fill_logprobs`), ``prefix_reused`` (turns whose prompt reused earlier tokens).
    """
    if not turns:
        raise AgentTurnError("a trajectory needs at least one turn")
    views = [t if isinstance(t, TurnTokens) else turn_tokens(t, records) for t in turns]
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    tool: list[bool] = []
    rewrites = dropped = 0
    first = views[0]
    ids.extend(first.prompt_ids)
    mask.extend([0] * len(first.prompt_ids))
    logprobs.extend([0.0] * len(first.prompt_ids))
    tool.extend([False] * len(first.prompt_ids))
    prompt_len = len(first.prompt_ids)
    for k, view in enumerate(views):
        prompt = view.prompt_ids
        if k > 0:
            keep = _common_prefix(ids, prompt)
            if keep < len(ids):
                rewrites += 1
                dropped += sum(m for m, t in zip(mask[keep:], tool[keep:], strict=True) if not t)
                del ids[keep:], mask[keep:], logprobs[keep:], tool[keep:]
                prompt_len = min(prompt_len, keep)
            segment = prompt[keep:]
            if train_tool_results:
                flags = _segment_tool_flags(view, turns[k], turns[k - 1], tokenizer, keep, segment)
            else:
                flags = [False] * len(segment)
            ids.extend(segment)
            mask.extend(int(f) for f in flags)
            logprobs.extend([0.0] * len(segment))
            tool.extend(flags)
        ids.extend(view.token_ids)
        mask.extend([1] * len(view.token_ids))
        logprobs.extend(view.logprobs)
        tool.extend([False] * len(view.token_ids))
    if rewrites:
        logger.debug(
            "agent rewrote history %d time(s); %d sampled tokens left the row", rewrites, dropped
        )
    return Trajectory(
        input_ids=ids,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        reward=reward,
        prompt_len=prompt_len,
        finish_reason="length" if views[-1].finish_reason == "length" else "stop",
        metadata={
            "turns": len(views),
            "history_rewrites": rewrites,
            "dropped_action_tokens": dropped,
            "tool_positions": [i for i, flag in enumerate(tool) if flag],
            "prefix_reused": sum(v.prefix_reused for v in views[1:]),
        },
    )


def _segment_tool_flags(
    view: TurnTokens,
    turn: AgentTrajectoryTurn | TurnTokens,
    previous: AgentTrajectoryTurn | TurnTokens,
    tokenizer: Any,
    start: int,
    segment: Sequence[int],
) -> list[bool]:
    if view.prompt_spans:
        roles = _span_roles(view.prompt_spans, start, start + len(segment))
        return [role == "tool" for role in roles]
    if not isinstance(turn, AgentTrajectoryTurn):
        return [False] * len(segment)
    seen = len(previous.messages) if isinstance(previous, AgentTrajectoryTurn) else 0
    texts = _tool_texts(turn.messages[seen:])
    if texts:
        warn_once(
            logger,
            "agentic.tool_text_search",
            "a turn's prompt has no message spans (the chat template does not render "
            "conversations incrementally); tool results are located by text search",
        )
    return _tool_flags_by_text(tokenizer, segment, texts)


Scorer = Callable[[list[list[int]], list[list[int]]], list[list[float]]]
"""``score(rows, positions)[r][k]``: the policy's log-probability of token ``positions[r][k]``
of row ``rows[r]`` given the tokens before it."""


def fill_logprobs(trajectories: Sequence[Trajectory], score: Scorer) -> int:
    """Replace the placeholder logprobs at ``metadata["tool_positions"]`` with scores from
    ``score``; returns how many positions were filled."""
    todo = [t for t in trajectories if t.metadata.get("tool_positions")]
    if not todo:
        return 0
    positions = [list(t.metadata["tool_positions"]) for t in todo]
    scored = score([t.input_ids for t in todo], positions)
    for trajectory, wanted, values in zip(todo, positions, scored, strict=True):
        for position, value in zip(wanted, values, strict=True):
            trajectory.rollout_logprobs[position] = float(value)
    return sum(len(p) for p in positions)


def _chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Row indices grouped by length so a padded chunk holds at most ``max_tokens`` tokens
    (a longer row gets a chunk of its own)."""
    order = sorted(range(len(lengths)), key=lambda r: lengths[r])
    chunks: list[list[int]] = []
    for r in order:
        if chunks and (len(chunks[-1]) + 1) * lengths[r] <= max_tokens:
            chunks[-1].append(r)
        else:
            chunks.append([r])
    return chunks


def model_scorer(model: Any, *, temperature: float = 1.0, max_batch_tokens: int = 16384) -> Scorer:
    """A :data:`Scorer` running ``model`` (a causal LM) in eval mode without gradients, with
    ``log_softmax(logits / temperature)`` as the trainer scores tokens. Only the logits that
    predict the requested positions are computed (``logits_to_keep``) when the model allows."""
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters

    def score(rows: list[list[int]], positions: list[list[int]]) -> list[list[float]]:
        out: list[list[float]] = [[0.0] * len(p) for p in positions]
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                for chunk in _chunks([len(r) for r in rows], max_batch_tokens):
                    values = _score_chunk(
                        model, [rows[r] for r in chunk], [positions[r] for r in chunk],
                        temperature=temperature, keeps=keeps,
                    )  # fmt: skip
                    for r, row_values in zip(chunk, values, strict=True):
                        out[r] = row_values
        finally:
            model.train(was_training)
        return out

    return score


def _score_chunk(
    model: Any,
    rows: list[list[int]],
    positions: list[list[int]],
    *,
    temperature: float,
    keeps: bool,
) -> list[list[float]]:
    """One padded forward pass over ``rows``; log-probabilities at ``positions`` (0 at 0)."""
    device = next(model.parameters()).device
    needed = sorted({p - 1 for ps in positions for p in ps if p > 0})
    if not needed:
        return [[0.0] * len(ps) for ps in positions]
    ids = torch.zeros((len(rows), max(len(r) for r in rows)), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
    kept = torch.tensor(needed)
    extra = {"logits_to_keep": kept.to(device)} if keeps else {}
    logits = model(
        input_ids=ids.to(device), attention_mask=attention.to(device), use_cache=False, **extra
    ).logits
    if not keeps:
        logits = logits[:, kept.to(device)]
    column = {p: k for k, p in enumerate(needed)}
    pairs = [(i, p) for i, ps in enumerate(positions) for p in ps if p > 0]
    row_i = torch.tensor([i for i, _ in pairs], device=device)
    col_i = torch.tensor([column[p - 1] for _, p in pairs], device=device)
    tok_i = torch.tensor([rows[i][p] for i, p in pairs], device=device)
    picked = logits[row_i, col_i].float() / temperature
    values = picked.log_softmax(-1).gather(-1, tok_i[:, None])[:, 0].cpu().tolist()
    found = dict(zip(pairs, values, strict=True))
    return [[found.get((i, p), 0.0) for p in ps] for i, ps in enumerate(positions)]


def _openai_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for call in message.get("tool_calls") or ():
        entry = _as_dict(call)
        if "function" in entry:
            entry["function"] = _as_dict(entry["function"])
        calls.append(entry)
    return calls


def _plain(message: Any) -> dict[str, Any]:
    entry = {k: v for k, v in _as_dict(message).items() if v is not None}
    if "tool_calls" in entry:
        entry["tool_calls"] = _openai_calls(entry)
    return entry


def trajectory_record(
    trajectory: Trajectory,
    turns: Sequence[AgentTrajectoryTurn],
    tokenizer: Any,
    *,
    item: AgentItem,
    messages: Sequence[Mapping[str, Any]] | None = None,
    answer: str | None = None,
    solutions: tuple[str, ...] = (),
    metadata: Mapping[str, Any] | None = None,
    records: Mapping[str, ServedCompletion] | None = None,
) -> RewardRecord:
    """The :class:`RewardRecord` a reward function sees for one agentic sample.

    ``messages`` is the final conversation when the agent gave one; otherwise the last turn's
    messages plus its reply. ``completion`` is what the model wrote in the last turn (tool-call
    markup included); ``metadata["trace"]`` has one entry per turn.
    """
    views = [turn_tokens(t, records) for t in turns]
    last = views[-1]
    if messages is None:
        conversation = [_plain(m) for m in turns[-1].messages] + [_plain(last.message)]
    else:
        conversation = [_plain(m) for m in messages]
    tool_calls = [call for v in views for call in _openai_calls(v.message)]
    tool_results = [m for m in conversation if m.get("role") == "tool"]
    body = list(last.token_ids)
    if last.finish_reason == "stop" and body:
        body = body[:-1]
    trace = [
        {
            "turn": k,
            "response_id": v.response_id,
            "prompt_tokens": len(v.prompt_ids),
            "completion_tokens": len(v.token_ids),
            "finish_reason": v.finish_reason,
            "content": v.message.get("content"),
            "tool_calls": _openai_calls(v.message),
            "prefix_reused": v.prefix_reused,
        }
        for k, v in enumerate(views)
    ]
    p = trajectory.prompt_len
    return RewardRecord(
        prompt=tokenizer.decode(trajectory.input_ids[:p]),
        completion=tokenizer.decode(body),
        answer=answer,
        solutions=solutions,
        messages=conversation,
        tool_calls=tool_calls,
        tool_results=tool_results,
        prompt_ids=tuple(trajectory.input_ids[:p]),
        token_ids=tuple(trajectory.input_ids[p:]),
        logprobs=tuple(trajectory.rollout_logprobs[p:]),
        loss_mask=tuple(trajectory.loss_mask[p:]),
        finish_reason=trajectory.finish_reason,
        row=item.row,
        prompt_index=item.prompt_index,
        sample_index=item.sample_index,
        metadata={**(metadata or {}), "turns": len(views), "trace": trace},
    )


__all__ = [
    "AgentTurnError",
    "Scorer",
    "TurnMismatchError",
    "TurnTokens",
    "build_trajectory",
    "fill_logprobs",
    "model_scorer",
    "response_reference",
    "served_turn_tokens",
    "trajectory_record",
    "turn_tokens",
]

"""Prompt token ids for chat requests, message by message, reusing sampled tokens.

:class:`PromptBuilder` renders a request's messages with the tokenizer's chat template and
encodes them one message at a time, which records which prompt tokens render which message
(``prompt_spans``). That needs a template whose rendering of a conversation extends the
rendering of its beginning; assistant turns are cut at their end-of-turn marker, so templates
that render the *last* assistant turn differently (Qwen3's thinking blocks) work too. When a
template is not incremental at all, the whole prompt is encoded at once without spans.

Cost: each message is rendered in a window of itself and its neighbours, so building a prompt
takes time linear in its number of messages (the pieces are checked against one rendering of
the whole conversation). Only when a template cannot be split that way are the conversation's
prefixes rendered one by one, within a budget of characters.

Token reuse: :meth:`PromptBuilder.remember` stores each served completion under a key of
(tools, the request's messages, the assistant message returned). When a later request holds
that assistant message after the same messages, its prompt is that completion's prompt ids +
sampled ids + the template's end-of-turn text, followed by the newly rendered messages, so
multi-turn trajectories share their prefixes token for token whatever the template would
make of the message text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from areno_core.models.chat import apply_chat_template, end_of_turn_token


@attrs.frozen
class Prompt:
    """Prompt token ids, the spans of the messages they render, and whether they reuse an
    earlier completion's tokens."""

    ids: list[int]
    spans: tuple[Mapping[str, Any], ...]
    reused: bool


@attrs.frozen
class _ReuseEntry:
    prompt_token_ids: tuple[int, ...]
    prompt_spans: tuple[Mapping[str, Any], ...]
    token_ids: tuple[int, ...]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def message_key(message: Mapping[str, Any]) -> Any:
    """What identifies a normalised message for token reuse: everything a chat template
    renders (tool-call ids excluded, arguments compared as JSON values)."""
    calls = []
    for call in message.get("tool_calls") or ():
        arguments = call["function"].get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        calls.append([call["function"]["name"], arguments])
    return [
        message.get("role"),
        message.get("content") or "",
        message.get("name"),
        message.get("reasoning_content"),
        calls,
    ]


def _prefix_digests(
    tools: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
) -> list[str]:
    """``out[j]`` identifies (tools, ``messages[:j]``), for every ``j`` up to ``len(messages)``;
    one pass, so long conversations cost linear time."""
    running = hashlib.sha1(_canonical(list(tools)).encode())
    out = [running.hexdigest()]
    for message in messages:
        running.update(b"\x00" + _canonical(message_key(message)).encode())
        out.append(running.hexdigest())
    return out


def _reuse_key(prefix_digest: str, reply: Mapping[str, Any]) -> str:
    return prefix_digest + ":" + hashlib.sha1(_canonical(message_key(reply)).encode()).hexdigest()


# Above this many characters of prefix renderings, the exact message-by-message rendering of a
# template that the windowed rendering could not split is skipped (the prompt is then encoded
# at once, without spans), so no request costs quadratic time in its number of messages.
EXACT_RENDER_BUDGET_CHARS = 4_000_000


class PromptBuilder:
    """Builds prompts for one endpoint session; safe to call from several threads.

    ``tokenizer_lock`` serialises the tokenizer calls (Hugging Face fast tokenizers must not
    be used from two threads at once); pass the lock the rest of the server uses.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        disable_thinking: bool = False,
        tokenizer_lock: threading.Lock | None = None,
        exact_budget_chars: int = EXACT_RENDER_BUDGET_CHARS,
    ) -> None:
        self.tokenizer = tokenizer
        self.disable_thinking = disable_thinking
        self.exact_budget_chars = exact_budget_chars
        self.tokenizer_lock = tokenizer_lock or threading.Lock()
        self._reuse: dict[str, _ReuseEntry] = {}
        self._reuse_lock = threading.Lock()
        self._eot = end_of_turn_token(tokenizer)
        eot_id = tokenizer.convert_tokens_to_ids(self._eot) if self._eot else None
        self._eot_id = eot_id if isinstance(eot_id, int) else None

    def remember(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        reply: Mapping[str, Any],
        *,
        prompt_ids: Sequence[int],
        prompt_spans: Sequence[Mapping[str, Any]],
        token_ids: Sequence[int],
    ) -> None:
        """Record that ``reply`` was sampled as ``token_ids`` after ``prompt_ids``."""
        key = _reuse_key(_prefix_digests(tools, messages)[-1], reply)
        entry = _ReuseEntry(tuple(prompt_ids), tuple(prompt_spans), tuple(token_ids))
        with self._reuse_lock:
            self._reuse.setdefault(key, entry)

    def _lookup(self, key: str) -> _ReuseEntry | None:
        with self._reuse_lock:
            return self._reuse.get(key)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        gen: bool = True,
    ) -> str:
        """The chat template's text for ``messages`` (with the generation prompt by default)."""
        return apply_chat_template(
            self.tokenizer,
            messages,
            tools=tools or None,
            add_generation_prompt=gen,
            disable_thinking=self.disable_thinking,
        )

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        with self.tokenizer_lock:
            return list(self.tokenizer.encode(text, add_special_tokens=False))

    def build(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        full: str | None = None,
        prefill: str = "",
    ) -> Prompt:
        """Prompt token ids for ``messages`` (see the module docstring).

        The prompt is encoded message by message, which records which tokens render which
        message (``prompt_spans``). That needs a template whose rendering of a conversation
        extends the rendering of its beginning; when it does not, the whole prompt is encoded
        at once and the spans are left empty. ``full`` is the template's rendering when the
        caller has it already. ``prefill`` is text appended after the generation prompt (the
        start of the reply forced by ``tool_choice``), encoded as its own span.
        """
        full = self.render(messages, tools, True) if full is None else full
        prompt = self._reuse_prefix(messages, tools, full)
        if prompt is None:
            pieces = self._pieces(messages, tools, full, start=0, prev="")
            if pieces is None:
                prompt = Prompt(self._encode(full), (), False)
            else:
                ids: list[int] = []
                spans: list[Mapping[str, Any]] = []
                self._append(ids, spans, pieces)
                prompt = Prompt(ids, tuple(spans), False)
        if prefill:
            ids = list(prompt.ids)
            spans = list(prompt.spans)
            self._append(ids, spans, [("tool_choice", None, prefill)])
            prompt = Prompt(ids, tuple(spans) if prompt.spans else (), prompt.reused)
        return prompt

    def _reuse_prefix(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], full: str
    ) -> Prompt | None:
        digests = _prefix_digests(tools, messages)
        for j in range(len(messages) - 1, -1, -1):
            if messages[j]["role"] != "assistant":
                continue
            entry = self._lookup(_reuse_key(digests[j], messages[j]))
            if entry is None:
                continue
            prev = self.render(messages[:j], tools, False) if j else ""
            cut = self._assistant_end(messages, tools, full, j, prev)
            if cut is None:
                return None
            after, end, rendered = cut
            ended = bool(entry.token_ids) and entry.token_ids[-1] == self._eot_id
            bridge = after if ended else (self._eot or "") + after
            rest = self._pieces(messages, tools, full, start=j + 1, prev=rendered[:end])
            if rest is None:
                return None
            ids = [*entry.prompt_token_ids, *entry.token_ids, *self._encode(bridge)]
            spans = [
                *entry.prompt_spans,
                {
                    "role": "assistant",
                    "message_index": j,
                    "start": len(entry.prompt_token_ids),
                    "end": len(ids),
                },
            ]
            self._append(ids, spans, rest)
            return Prompt(ids, tuple(spans), True)
        return None

    def _assistant_end(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]],
        full: str,
        i: int,
        prev: str,
    ) -> tuple[str, int, str] | None:
        """Where assistant message ``i`` ends inside a rendering that goes on after it.

        Templates may render the last assistant turn differently from the same turn
        mid-conversation (thinking blocks), so the turn is cut at its end-of-turn marker in
        the rendering of the next message (or of the generation prompt), plus the text the
        template writes after that marker. Returns (that text, end offset, the rendering).
        ``full`` is the rendering of all of ``messages`` with the generation prompt.
        """
        eot = self._eot
        if not eot:
            return None
        alone = self.render(messages[: i + 1], tools, False)
        marker = alone.rfind(eot)
        if not alone.startswith(prev) or marker < len(prev):
            return None
        after = alone[marker + len(eot) :]
        following = self.render(messages[: i + 2], tools, False) if i + 1 < len(messages) else full
        if not following.startswith(prev):
            return None
        close = following.find(eot, len(prev))
        if close < 0 or not following.startswith(after, close + len(eot)):
            return None
        return after, close + len(eot) + len(after), following

    def _pieces(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        full: str,
        *,
        start: int,
        prev: str,
    ) -> list[tuple[str, int | None, str]] | None:
        """Text pieces (role, message index, text) of messages ``start:`` plus the generation
        prompt, given the rendering ``prev`` of the messages before; None when the template
        does not render the conversation incrementally.

        Each message is first rendered in a small window (itself after the message before
        it), which costs time linear in the conversation; the pieces are accepted when they
        add up to the full rendering exactly. Otherwise each prefix of the conversation is
        rendered in turn, as long as that stays within ``exact_budget_chars``.
        """
        pieces = self._window_pieces(messages, tools, full, start=start, prev=prev)
        if pieces is not None:
            return pieces
        if (len(messages) - start) * len(full) > self.exact_budget_chars:
            return None
        return self._exact_pieces(messages, tools, full, start=start, prev=prev)

    def _window_pieces(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        full: str,
        *,
        start: int,
        prev: str,
    ) -> list[tuple[str, int | None, str]] | None:
        pieces: list[tuple[str, int | None, str]] = []
        offset = len(prev)
        if not full.startswith(prev):
            return None
        for i in range(start, len(messages)):
            head = messages[i - 1 : i] if i else []
            window = [*head, messages[i]]
            before = self.render(head, tools, False) if head else ""
            if messages[i]["role"] == "assistant":
                last = i + 1 == len(messages)
                window_full = self.render(window, tools, True) if last else ""
                cut = self._assistant_end(
                    [*window, *messages[i + 1 : i + 2]], tools, window_full, len(head), before
                )
                if cut is None:
                    return None
                _, end, rendered = cut
                piece = rendered[len(before) : end]
            else:
                rendered = self.render(window, tools, False)
                if not rendered.startswith(before):
                    return None
                piece = rendered[len(before) :]
            if not full.startswith(piece, offset):
                return None
            pieces.append((messages[i]["role"], i, piece))
            offset += len(piece)
        pieces.append(("generation_prompt", None, full[offset:]))
        return pieces

    def _exact_pieces(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        full: str,
        *,
        start: int,
        prev: str,
    ) -> list[tuple[str, int | None, str]] | None:
        pieces: list[tuple[str, int | None, str]] = []
        for i in range(start, len(messages)):
            role = messages[i]["role"]
            if role == "assistant":
                cut = self._assistant_end(messages, tools, full, i, prev)
                if cut is None:
                    return None
                _, end, rendered = cut
                pieces.append((role, i, rendered[len(prev) : end]))
                prev = rendered[:end]
                continue
            rendered = self.render(messages[: i + 1], tools, False)
            if not rendered.startswith(prev):
                return None
            pieces.append((role, i, rendered[len(prev) :]))
            prev = rendered
        if not full.startswith(prev):
            return None
        pieces.append(("generation_prompt", None, full[len(prev) :]))
        return pieces

    def _append(
        self,
        ids: list[int],
        spans: list[Mapping[str, Any]],
        pieces: list[tuple[str, int | None, str]],
    ) -> None:
        for role, index, text in pieces:
            piece = self._encode(text)
            if piece:
                spans.append(
                    {
                        "role": role,
                        "message_index": index,
                        "start": len(ids),
                        "end": len(ids) + len(piece),
                    }
                )
                ids.extend(piece)


__all__ = ["EXACT_RENDER_BUDGET_CHARS", "Prompt", "PromptBuilder", "message_key"]

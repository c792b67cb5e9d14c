"""Check that loaded rows have the keys an algorithm needs, before any training starts.

Each algorithm plugin declares a :class:`~areno_core.algorithm.RowSchema`; the standard ones
are here:

* ``SFT_SCHEMA``: prompt and response, each a string or a chat list;
* ``DPO_SCHEMA``: prompt, chosen and rejected, each a string or a chat list;
* ``RL_SCHEMA``: prompt (string or chat list); optional solutions (list or string) and
  answer (string, int or float);
* ``AGENTIC_SCHEMA``: nothing required (each row must be a dict); optional prompt.

A "chat" value is a non-empty list of messages, each a dict with a ``role`` string and a
``content`` (string, list of content parts, or None). An optional key set to None counts as
absent. A reply (``response``, ``chosen``, ``rejected``) given as a chat list must be exactly
one assistant message: several turns after the prompt are refused here, before training. DPO
also accepts rows that have only ``chosen`` and ``rejected`` as full chat lists sharing their
opening messages: :func:`split_chat_preference` turns such a row into
prompt/chosen/rejected, and :func:`validate_rows` accepts it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from areno_core.algorithm import RowSchema
from areno_core.errors import DatasetError
from areno_core.log import get_logger

logger = get_logger(__name__)

# Keys whose list values are chat message lists (validated message by message).
CHAT_KEYS = frozenset({"prompt", "response", "chosen", "rejected", "messages"})
# Keys holding the trained reply: as a chat list, exactly one assistant message.
REPLY_KEYS = frozenset({"response", "chosen", "rejected"})
# Keys whose list values must hold items of these types.
LIST_ITEM_TYPES: Mapping[str, tuple[type, ...]] = {"solutions": (str, int, float)}

_TEXT_OR_CHAT = (str, list)

SFT_SCHEMA = RowSchema(
    required={"prompt": _TEXT_OR_CHAT, "response": _TEXT_OR_CHAT},
    description="supervised fine-tuning: the model learns to produce 'response' after 'prompt'",
)
DPO_SCHEMA = RowSchema(
    required={"prompt": _TEXT_OR_CHAT, "chosen": _TEXT_OR_CHAT, "rejected": _TEXT_OR_CHAT},
    description=(
        "preference pairs: 'chosen' is preferred over 'rejected' as a reply to 'prompt'; rows "
        "with only chosen/rejected chat lists sharing their opening messages are split "
        "automatically"
    ),
)
RL_SCHEMA = RowSchema(
    required={"prompt": _TEXT_OR_CHAT},
    optional={"solutions": (list, str), "answer": (str, int, float)},
    description="online RL: a prompt to sample from, plus what the reward function checks",
)
AGENTIC_SCHEMA = RowSchema(
    required={},
    optional={"prompt": _TEXT_OR_CHAT},
    description="agentic RL: any task fields, passed to the agent function unchanged",
)


def validate_rows(
    rows: Sequence[Any], schema: RowSchema, *, algo: str, source: str | None = None
) -> None:
    """Raise :class:`DatasetError` for the first row that does not match ``schema``.

    The message names the algorithm, the 0-based row index (and ``source``, the file the rows
    came from, when given), the key, the type found and the types expected, and lists the keys
    the row has.
    """
    if not rows:
        raise DatasetError(f"{algo}: the dataset has no rows after loading")
    for index, row in enumerate(rows):
        _validate_row(row, _row_label(index, source), schema, algo)
    logger.debug("%s: %d rows match the row schema", algo, len(rows))


def split_preference_rows(
    rows: Sequence[Any], *, algo: str, source: str | None = None
) -> list[Any]:
    """``rows`` with every whole-conversation pair (see :func:`is_chat_preference_row`) split
    by :func:`split_chat_preference`; a pair that cannot be split is an error naming its row
    (and ``source``)."""
    out = []
    for index, row in enumerate(rows):
        if isinstance(row, Mapping) and is_chat_preference_row(row):
            try:
                row = split_chat_preference(row)
            except DatasetError as exc:
                raise DatasetError(
                    f"{algo}: {_row_label(index, source)} has no 'prompt' and its "
                    f"chosen/rejected chat lists cannot be split into one: {exc}. {_keys_of(row)}"
                ) from exc
        out.append(row)
    return out


def _row_label(index: int, source: str | None) -> str:
    return f"dataset row {index}" + (f" of {source}" if source else "")


def split_chat_preference(row: Mapping[str, Any]) -> dict[str, Any]:
    """Split a row whose ``chosen`` and ``rejected`` are whole conversations.

    The messages both conversations open with become ``prompt``; what follows becomes
    ``chosen`` and ``rejected`` (each starting with an assistant message). Other keys are kept.
    """
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not isinstance(chosen, list) or not isinstance(rejected, list):
        raise DatasetError(
            "split_chat_preference needs 'chosen' and 'rejected' to be chat lists, got "
            f"{_type_name(chosen)} and {_type_name(rejected)}"
        )
    for key, messages in (("chosen", chosen), ("rejected", rejected)):
        problem = _chat_problem(messages)
        if problem:
            raise DatasetError(f"'{key}' is not a chat list: {problem}")
    shared = 0
    for left, right in zip(chosen, rejected, strict=False):
        if left != right:
            break
        shared += 1
    if shared == 0:
        raise DatasetError(
            "'chosen' and 'rejected' share no opening messages, so there is no prompt to split "
            "off; give the row a 'prompt' key"
        )
    if shared == len(chosen) or shared == len(rejected):
        raise DatasetError(
            f"'chosen' ({len(chosen)} messages) and 'rejected' ({len(rejected)} messages) do not "
            "differ after their shared opening messages; each needs its own reply"
        )
    for key, messages in (("chosen", chosen), ("rejected", rejected)):
        role = messages[shared].get("role")
        if role != "assistant":
            raise DatasetError(
                f"after the {shared} shared prompt messages, '{key}' continues with a {role!r} "
                "message; the first message after the prompt must have role 'assistant'"
            )
    out = dict(row)
    out["prompt"] = list(chosen[:shared])
    out["chosen"] = list(chosen[shared:])
    out["rejected"] = list(rejected[shared:])
    return out


def is_chat_preference_row(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` has no prompt but chat-list ``chosen`` and ``rejected`` to split."""
    return (
        row.get("prompt") is None
        and isinstance(row.get("chosen"), list)
        and isinstance(row.get("rejected"), list)
    )


def _validate_row(row: Any, label: str, schema: RowSchema, algo: str) -> None:
    if not isinstance(row, Mapping):
        raise DatasetError(
            f"{algo}: {label} is of type {type(row).__name__}, not a dict; "
            "a loader must return dicts"
        )
    if schema == DPO_SCHEMA and is_chat_preference_row(row):
        try:
            row = split_chat_preference(row)
        except DatasetError as exc:
            raise DatasetError(
                f"{algo}: {label} has no 'prompt' and its chosen/rejected chat lists "
                f"cannot be split into one: {exc}. {_keys_of(row)}"
            ) from exc
    for key, types in schema.required.items():
        if key not in row:
            raise DatasetError(
                f"{algo}: {label} is missing the required key '{key}' (expected "
                f"{_expected(key, types)}). {_keys_of(row)}. {_hint(schema)}"
            )
        _check_value(row, key, types, label, algo)
    for key, types in schema.optional.items():
        if row.get(key) is not None:
            _check_value(row, key, types, label, algo)


def _check_value(
    row: Mapping[str, Any], key: str, types: tuple[type, ...], label: str, algo: str
) -> None:
    value = row[key]
    if not _matches(value, types):
        raise DatasetError(
            f"{algo}: {label}: key '{key}' has type {_type_name(value)}, expected "
            f"{_expected(key, types)}. {_keys_of(row)}"
        )
    if not isinstance(value, list):
        return
    if key in CHAT_KEYS:
        problem = _chat_problem(value)
        if problem:
            raise DatasetError(
                f"{algo}: {label}: key '{key}' is a list, so it must be a chat "
                f"message list, but {problem}. Each message must be a dict with a 'role' "
                f"string and a 'content'. {_keys_of(row)}"
            )
        if key in REPLY_KEYS and (len(value) != 1 or value[0].get("role") != "assistant"):
            roles = ", ".join(repr(m.get("role")) for m in value)
            raise DatasetError(
                f"{algo}: {label}: key '{key}' holds {len(value)} message(s) with roles {roles}; "
                f"as a chat list, '{key}' must be exactly one assistant message (training on "
                "several turns after the prompt is not supported). Keep the first assistant "
                "reply, or move the earlier turns into 'prompt', or drop the row (a "
                f"--dataset-loader-fn that returns None for it). {_keys_of(row)}"
            )
    item_types = LIST_ITEM_TYPES.get(key)
    if item_types is not None:
        for position, item in enumerate(value):
            if not _matches(item, item_types):
                raise DatasetError(
                    f"{algo}: {label}: key '{key}' item {position} has type "
                    f"{_type_name(item)}, expected {_names(item_types)}. {_keys_of(row)}"
                )


def _chat_problem(messages: list[Any]) -> str | None:
    """What is wrong with ``messages`` as a chat list, or None when it is fine."""
    if not messages:
        return "the list is empty"
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return f"message {position} is of type {_type_name(message)}, not a dict"
        if "role" not in message:
            return f"message {position} has no 'role' (its keys: {_list(message)})"
        if not isinstance(message["role"], str) or not message["role"]:
            return f"message {position} has role {message['role']!r}, expected a non-empty string"
        if "content" not in message:
            return f"message {position} has no 'content' (its keys: {_list(message)})"
        content = message["content"]
        if content is not None and not isinstance(content, str | list):
            return (
                f"message {position} has content of type {_type_name(content)}, expected str, "
                "list or None"
            )
    return None


def _matches(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, but not an answer or a prompt
    return isinstance(value, types)


def _expected(key: str, types: tuple[type, ...]) -> str:
    text = _names(types)
    if key in CHAT_KEYS and list in types:
        text += " (a list means chat messages)"
    return text


def _names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


def _type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _list(keys: Mapping[str, Any]) -> str:
    return ", ".join(repr(k) for k in keys) or "none"


def _keys_of(row: Mapping[str, Any]) -> str:
    return f"The row has keys: {_list(row)}"


def _hint(schema: RowSchema) -> str:
    return (
        f"Rows must have {schema.describe()}; use --dataset-loader-fn to map raw rows to "
        "this schema"
    )


__all__ = [
    "AGENTIC_SCHEMA",
    "CHAT_KEYS",
    "DPO_SCHEMA",
    "LIST_ITEM_TYPES",
    "REPLY_KEYS",
    "RL_SCHEMA",
    "SFT_SCHEMA",
    "is_chat_preference_row",
    "split_chat_preference",
    "split_preference_rows",
    "validate_rows",
]

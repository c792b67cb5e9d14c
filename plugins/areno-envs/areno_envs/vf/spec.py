"""The spec rows that tell the ``vf`` loader which tasks of a verifiers taskset to train on.

One JSON object per line of the ``--dataset-path`` file::

    {"taskset": "my_env", "config": {"difficulty": 2}, "range": [0, 500],
     "max_turns": 4, "tool_choice": "required"}

- ``taskset``: the installed verifiers taskset (its package name).
- ``config``: the taskset's own options (fields of its ``vf.TasksetConfig``), checked by name
  and type.
- ``range``: positions ``[start, stop)`` of the taskset's task stream (default: all of them;
  required for an infinite taskset).
- ``max_turns`` (multi-turn, default 8): most model calls per episode.
- ``tool_choice`` (multi-turn, default ``"auto"``): what the first request of an episode sends
  as ``tool_choice`` (``"auto"``, ``"required"`` or a tool's name); later requests send
  ``"auto"``. verifiers' own chat loop sends none; a small policy that must learn to call
  a tool can be made to call one on the first turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from areno_core.errors import ConfigError
from areno_envs.spec_rows import check_row_keys

KEYS: tuple[str, ...] = ("taskset", "config", "range", "max_turns", "tool_choice")
DEFAULT_MAX_TURNS = 8


@attrs.frozen
class VfSpec:
    """One checked spec row."""

    taskset: str
    config: Mapping[str, Any]
    start: int = 0
    stop: int | None = None
    max_turns: int = DEFAULT_MAX_TURNS
    tool_choice: str = "auto"


def parse_spec(row: Mapping[str, Any]) -> VfSpec:
    """Check one spec row's shape (the taskset's options are checked when it loads)."""
    check_row_keys(row, KEYS, "verifiers")
    taskset = row.get("taskset")
    if not isinstance(taskset, str) or not taskset:
        raise ConfigError(f"verifiers spec row: 'taskset' must name a taskset, got {taskset!r}")
    config = row.get("config") or {}
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"verifiers spec row: 'config' must be an object of the taskset's options, got "
            f"{config!r}"
        )
    start, stop = 0, None
    if "range" in row:
        value = row["range"]
        ok = (
            isinstance(value, list | tuple)
            and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and 0 <= value[0] < value[1]
        )
        if not ok:
            raise ConfigError(
                f"verifiers spec row: 'range' must be [start, stop] with 0 <= start < stop, "
                f"got {value!r}"
            )
        start, stop = int(value[0]), int(value[1])
    max_turns = row.get("max_turns", DEFAULT_MAX_TURNS)
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ConfigError(
            f"verifiers spec row: 'max_turns' must be an integer >= 1, got {max_turns!r}"
        )
    tool_choice = row.get("tool_choice", "auto")
    if not isinstance(tool_choice, str) or not tool_choice:
        raise ConfigError(
            f"verifiers spec row: 'tool_choice' must be 'auto', 'required' or a tool's name, "
            f"got {tool_choice!r}"
        )
    return VfSpec(
        taskset=taskset,
        config=dict(config),
        start=start,
        stop=stop,
        max_turns=max_turns,
        tool_choice=tool_choice,
    )

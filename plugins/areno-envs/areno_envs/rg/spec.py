"""The spec rows that tell the ``rg`` loaders which reasoning-gym problems to generate.

A reasoning-gym dataset is generated, not read: a dataset file for the ``rg`` loaders holds
*spec rows*, each naming a slice of one seeded reasoning-gym dataset::

    {"task": "chain_sum", "seed": 0, "size": 2200, "range": [0, 2000],
     "config": {"min_terms": 2, "max_terms": 2}, "format": "chat"}

- ``task``: a reasoning-gym task name (optional with the per-task loader ``rg/<task>``).
- ``seed`` (default 0) and ``size``: the dataset ``reasoning_gym.create_dataset(task,
  seed=seed, size=size, **config)`` builds. Two spec rows with the same task, seed, size and
  config describe the same dataset, so disjoint ranges of it are disjoint problems.
- ``range`` (default ``[0, size]``): the indices of that dataset to turn into rows.
- ``exclude``: ranges of the same dataset whose questions are left out of this one (an eval
  split that shares no question with the train split).
- ``config``: the task's own options (the fields of its config dataclass, checked by name).
- ``format``: ``"chat"`` (default: reasoning-gym's system prompt, the question as the user
  message, the answer read from ``<answer>...</answer>``) or ``"text"`` (the question as a
  plain-text prompt, the whole completion is the answer).
- ``system_prompt``: with ``"chat"``, one of reasoning-gym's ``SYSTEM_PROMPTS`` by name
  (default ``"default"``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from areno_core.errors import ConfigError, did_you_mean
from areno_envs.rg.tasks import check_task, config_fields
from areno_envs.spec_rows import check_row_keys

FORMATS: tuple[str, ...] = ("chat", "text")
DEFAULT_SYSTEM_PROMPT = "default"
KEYS: tuple[str, ...] = (
    "task", "seed", "size", "range", "exclude", "config", "format", "system_prompt",
)  # fmt: skip


@attrs.frozen
class RgSpec:
    """One checked spec row."""

    task: str
    seed: int
    size: int
    start: int
    stop: int
    config: Mapping[str, Any]
    exclude: tuple[tuple[int, int], ...] = ()
    format: str = "chat"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT

    @property
    def dataset_key(self) -> tuple[str, int, int, str]:
        """What identifies the generated dataset (hashable, for caching)."""
        return (self.task, self.seed, self.size, json.dumps(dict(self.config), sort_keys=True))


def _int(row: Mapping[str, Any], key: str, default: int | None, *, minimum: int) -> int:
    value = row.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"reasoning-gym spec row: {key!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _range(value: Any, size: int, what: str) -> tuple[int, int]:
    ok = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not ok or not 0 <= value[0] < value[1] <= size:
        raise ConfigError(
            f"reasoning-gym spec row: {what} must be [start, stop] with 0 <= start < stop <= "
            f"size ({size}), got {value!r}"
        )
    return int(value[0]), int(value[1])


def check_config(task: str, config: Any) -> dict[str, Any]:
    """``config`` when every key is an option of ``task``; else an error listing them."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"reasoning-gym task {task!r}: 'config' must be an object of the task's options, "
            f"got {config!r}"
        )
    fields = config_fields(task)
    for key, value in config.items():
        if key not in fields:
            reserved = " (set it as the spec row's own key)" if key in ("seed", "size") else ""
            raise ConfigError(
                f"reasoning-gym task {task!r} has no option {key!r}{reserved}."
                f"{did_you_mean(str(key), fields)} Its options: "
                f"{', '.join(f'{k}={v!r}' for k, v in fields.items()) or 'none'}"
            )
        expected = _expected_type(fields[key])
        if expected is not None and not _fits(value, fields[key]):
            raise ConfigError(
                f"reasoning-gym task {task!r}: option {key!r} expects {expected} (its default "
                f"is {fields[key]!r}), got {value!r}"
            )
    return dict(config)


def _expected_type(default: Any) -> str | None:
    """What a value of an option with this default must be (None: not checked here)."""
    kinds = (
        (bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"),
        (list | tuple, "a list"), (dict, "an object"),
    )  # fmt: skip
    for kind, name in kinds:
        if isinstance(default, kind):
            return name
    return None


def _fits(value: Any, default: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, list | tuple):
        return isinstance(value, list | tuple)
    return isinstance(value, dict) if isinstance(default, dict) else True


def with_env_args(row: Any, env_args: Mapping[str, Any] | None) -> Any:
    """The spec row with the run's ``--env-args`` laid over its ``config`` (checked with it)."""
    if not env_args or not isinstance(row, Mapping):
        return row
    config = row.get("config") or {}
    if not isinstance(config, Mapping):
        return row  # parse_spec names the bad 'config'
    return {**row, "config": {**config, **env_args}}


def parse_spec(row: Mapping[str, Any], *, task: str | None = None) -> RgSpec:
    """Check one spec row (``task`` fixed by a per-task loader) and return it."""
    check_row_keys(row, KEYS, "reasoning-gym")
    named = row.get("task")
    if task is not None and named is not None and named != task:
        raise ConfigError(
            f"reasoning-gym spec row names task {named!r}, but the loader is rg/{task}; drop "
            "the row's 'task' or use the loader 'rg'"
        )
    if task is None and named is None:
        raise ConfigError(
            "reasoning-gym spec row has no 'task'; name one (the loader 'rg' reads it from "
            "each row) or use the per-task loader rg/<task>"
        )
    name = check_task(task if task is not None else named)
    seed = _int(row, "seed", 0, minimum=0)
    size = _int(row, "size", None, minimum=1)
    start, stop = _range(row.get("range", [0, size]), size, "'range'")
    exclude_raw = row.get("exclude", [])
    if not isinstance(exclude_raw, list | tuple):
        raise ConfigError(
            f"reasoning-gym spec row: 'exclude' must be a list of ranges, got {exclude_raw!r}"
        )
    exclude = tuple(_range(r, size, "each 'exclude' range") for r in exclude_raw)
    fmt = row.get("format", "chat")
    if fmt not in FORMATS:
        raise ConfigError(
            f"reasoning-gym spec row: 'format' must be one of {', '.join(FORMATS)}, got {fmt!r}"
        )
    system_prompt = row.get("system_prompt", DEFAULT_SYSTEM_PROMPT)
    if not isinstance(system_prompt, str):
        raise ConfigError(
            f"reasoning-gym spec row: 'system_prompt' must be a name, got {system_prompt!r}"
        )
    return RgSpec(
        task=name,
        seed=seed,
        size=size,
        start=start,
        stop=stop,
        config=check_config(name, row.get("config")),
        exclude=exclude,
        format=str(fmt),
        system_prompt=system_prompt,
    )

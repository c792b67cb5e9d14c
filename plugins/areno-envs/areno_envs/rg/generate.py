"""Build reasoning-gym datasets from spec rows, and turn their problems into areno rows.

Every row keeps, under ``"rg"``, what identifies its problem (task, seed, size, config and
index), so the reward regenerates the exact entry reasoning-gym made and scores with the
task's own ``score_answer``; rows stay small and JSON-plain whatever a task's metadata holds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from areno_core.errors import ConfigError
from areno_envs.rg.spec import RgSpec
from areno_envs.rg.tasks import datasets

ROW_KEY = "rg"


@functools.lru_cache(maxsize=64)
def _dataset(task: str, seed: int, size: int, config_json: str) -> Any:
    dataset_cls, config_cls = datasets()[task]
    config = json.loads(config_json)
    try:
        cfg = config_cls(seed=seed, size=size, **config)
        if hasattr(cfg, "validate"):
            cfg.validate()
        return dataset_cls(config=cfg)
    except Exception as exc:  # the task's own checks (mostly AssertionError) name the problem
        raise ConfigError(
            f"reasoning-gym task {task!r} rejects config {config!r}: {type(exc).__name__}: "
            f"{exc or 'invalid options'}"
        ) from exc


def dataset_for(spec: RgSpec) -> Any:
    """The reasoning-gym dataset ``spec`` describes (cached)."""
    return _dataset(*spec.dataset_key)


def _system_prompt(name: str) -> str:
    from reasoning_gym.utils import SYSTEM_PROMPTS  # imported with reasoning-gym itself

    if name not in SYSTEM_PROMPTS:
        raise ConfigError(
            f"reasoning-gym spec row: unknown system_prompt {name!r}; reasoning-gym's prompts: "
            f"{', '.join(sorted(SYSTEM_PROMPTS))}"
        )
    return SYSTEM_PROMPTS[name]


def prompt_for(spec: RgSpec, question: str) -> str | list[dict[str, str]]:
    """The prompt of one problem: chat messages, or plain text ending in a space."""
    if spec.format == "text":
        return question.rstrip() + " "
    return [
        {"role": "system", "content": _system_prompt(spec.system_prompt)},
        {"role": "user", "content": question},
    ]


def build_rows(spec: RgSpec) -> list[dict[str, Any]]:
    """The RL rows of ``spec``'s range, without the questions of its ``exclude`` ranges."""
    dataset = dataset_for(spec)
    if spec.format == "chat":
        _system_prompt(spec.system_prompt)  # a bad name fails before any problem is made
    key = spec.dataset_key
    excluded = {
        _entry(key, dataset, i)["question"] for lo, hi in spec.exclude for i in range(lo, hi)
    }
    rows = []
    for index in range(spec.start, spec.stop):
        entry = _entry(key, dataset, index)
        question = str(entry["question"])
        if question in excluded:
            continue
        answer = entry.get("answer")
        row: dict[str, Any] = {
            "prompt": prompt_for(spec, question),
            ROW_KEY: {
                "task": spec.task,
                "seed": spec.seed,
                "size": spec.size,
                "config": dict(spec.config),
                "index": index,
                "format": spec.format,
            },
        }
        if answer is not None:
            row["answer"] = str(answer)
        rows.append(row)
    return rows


def entry_for(meta: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The dataset and the entry a row's ``"rg"`` metadata names."""
    config_json = json.dumps(dict(meta.get("config") or {}), sort_keys=True)
    key = (str(meta["task"]), int(meta["seed"]), int(meta["size"]), config_json)
    dataset = _dataset(*key)
    return dataset, _entry(key, dataset, int(meta["index"]))


# Entries already generated in this process, by (dataset key, index): some tasks take up to a
# second per problem, and the loader, the held-out split's exclusion and the reward all need
# the same entries. About 1 KB each; a run holds its datasets' entries anyway.
_ENTRIES: dict[tuple[tuple[str, int, int, str], int], dict[str, Any]] = {}


def _entry(key: tuple[str, int, int, str], dataset: Any, index: int) -> dict[str, Any]:
    entry = _ENTRIES.get((key, index))
    if entry is None:
        entry = _ENTRIES[(key, index)] = dataset[index]
    return entry

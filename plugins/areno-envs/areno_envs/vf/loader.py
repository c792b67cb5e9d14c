"""The ``vf`` dataset loader: each spec row (see :mod:`areno_envs.vf.spec`) becomes one RL row
per task of the verifiers taskset it names.

A row's ``prompt`` is the task's chat messages (system prompt, then its prompt); its ``vf``
key holds what the reward and the agent need to rebuild the task: the taskset, its options,
the task's wire data (``TaskData.model_dump(mode="json")``) and the episode settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from areno_envs.vf.episode import prompt_messages
from areno_envs.vf.library import load_tasks
from areno_envs.vf.spec import parse_spec

ROW_KEY = "vf"


def vf_loader(
    row: Mapping[str, Any], *, env_args: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """RL rows of the tasks a spec row names; ``env_args`` (the run's ``--env-args``) are
    taskset options laid over the row's ``config``."""
    spec = parse_spec(row)
    if env_args:
        spec = attrs.evolve(spec, config={**spec.config, **env_args})
    rows = []
    for task in load_tasks(spec.taskset, spec.config, spec.start, spec.stop):
        prompt = prompt_messages(task)
        rows.append(
            {
                "prompt": prompt,
                ROW_KEY: {
                    "taskset": spec.taskset,
                    "config": dict(spec.config),
                    "idx": task.data.idx,
                    "data": task.data.model_dump(mode="json", exclude_defaults=True),
                    "max_turns": spec.max_turns,
                    "tool_choice": spec.tool_choice,
                },
            }
        )
    return rows

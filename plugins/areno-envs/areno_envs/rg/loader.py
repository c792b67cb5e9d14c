"""The ``rg`` dataset loaders: each spec row (see :mod:`areno_envs.rg.spec`) becomes the RL
rows of the reasoning-gym problems it names.

``rg`` reads the task from each row (one file may mix tasks); ``rg/<task>`` is registered
for every task of the installed reasoning-gym and fixes it, so the same spec file serves any
task. ``rg_sft`` turns the same problems into SFT rows (the reference answer as the response),
for making a warm start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from areno_envs.rg.generate import build_rows
from areno_envs.rg.spec import parse_spec, with_env_args


def rg_loader(
    row: dict[str, Any], *, env_args: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """RL rows of the problems a spec row names (the row names its task); ``env_args`` (the
    run's ``--env-args``) are task options laid over the row's ``config``."""
    return build_rows(parse_spec(with_env_args(row, env_args)))


@functools.cache
def task_loader(task: str) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """The loader ``rg/<task>``: like ``rg`` with the task fixed."""

    def load_row(
        row: dict[str, Any], *, env_args: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        return build_rows(parse_spec(with_env_args(row, env_args), task=task))

    load_row.__qualname__ = load_row.__name__ = f"rg_{task}_loader"
    return load_row


def rg_sft_loader(
    row: dict[str, Any], *, env_args: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """SFT rows (prompt, reference answer as the response) of the problems a spec row names."""
    out = []
    for rl_row in build_rows(parse_spec(with_env_args(row, env_args))):
        if "answer" in rl_row:
            out.append({"prompt": rl_row["prompt"], "response": rl_row["answer"]})
    return out

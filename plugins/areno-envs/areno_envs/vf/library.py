"""Finding an installed verifiers taskset, checking its options, and rebuilding its tasks.

A verifiers environment is a package exporting a ``vf.Taskset`` subclass; its id is the
package name (``verifiers.v1.load_taskset`` imports it the same way). Its options are the
fields of the taskset's ``vf.TasksetConfig`` subclass. verifiers is imported on first use,
never when the pack registers (it takes 15-20 s to import on the shared 2-core machine).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from areno_core.errors import ConfigError, did_you_mean

VERIFIERS_TESTED = "0.4.0"
# Options of every TasksetConfig that the adapter sets itself or that need a file.
RESERVED = ("id", "system_prompt")


def verifiers() -> Any:
    """``verifiers.v1``, or an error saying how to install the tested version."""
    try:
        import verifiers.v1 as vf  # optional dependency: the pack's 'verifiers' extra
    except ImportError as exc:
        raise ConfigError(
            "verifiers is not installed; the vf loader, reward and agent need it: pip install "
            f"'areno-envs[verifiers]' (tested with verifiers=={VERIFIERS_TESTED}) ({exc})"
        ) from exc
    return vf


@functools.cache
def taskset_class(taskset: str) -> type:
    """The ``vf.Taskset`` subclass the installed package ``taskset`` exports."""
    from verifiers.v1.utils.loaders import taskset_class as find  # with verifiers itself

    verifiers()
    try:
        return find(taskset)
    except (ModuleNotFoundError, TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"verifiers taskset {taskset!r} could not be loaded: it must be an installed "
            f"package exporting one vf.Taskset subclass in __all__ ({exc})"
        ) from exc


def option_fields(taskset: str) -> dict[str, Any]:
    """The options ``taskset`` accepts, with their defaults (None when required)."""
    from verifiers.v1.utils.loaders import taskset_config_type  # with verifiers itself

    taskset_class(taskset)
    fields = taskset_config_type(taskset).model_fields
    return {
        name: (None if field.is_required() else field.get_default(call_default_factory=True))
        for name, field in fields.items()
        if name not in RESERVED
    }


def _options_key(options: Mapping[str, Any]) -> str:
    return json.dumps(dict(options), sort_keys=True)


@functools.cache
def _config(taskset: str, options_json: str) -> Any:
    from pydantic import ValidationError  # a dependency of verifiers
    from verifiers.v1.utils.loaders import taskset_config_type  # with verifiers itself

    options = json.loads(options_json)
    fields = option_fields(taskset)
    for key in options:
        if key not in fields:
            raise ConfigError(
                f"verifiers taskset {taskset!r} has no option {key!r}."
                f"{did_you_mean(str(key), fields)} Its options: "
                f"{', '.join(f'{k}={v!r}' for k, v in fields.items() if k != 'task')}"
            )
    try:
        return taskset_config_type(taskset)(id=taskset, **options)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}={e.get('input')!r}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"verifiers taskset {taskset!r}: bad option value ({problems})") from exc


def taskset_config(taskset: str, options: Mapping[str, Any]) -> Any:
    """The checked ``TasksetConfig`` of ``taskset`` with ``options``; an unknown option or a
    value of the wrong type is an error naming it."""
    return _config(taskset, _options_key(options))


def load_tasks(taskset: str, options: Mapping[str, Any], start: int, stop: int | None) -> list:
    """Tasks ``start`` to ``stop`` (exclusive; None: to the end) of the taskset."""
    verifiers()
    config = taskset_config(taskset, options)
    view = taskset_class(taskset)(config).skip(start)
    if stop is not None:
        view = view.take(stop - start)
    elif not view.bounded:
        raise ConfigError(f"verifiers taskset {taskset!r} is infinite; give the spec row a 'range'")
    return list(view)


def rebuild_task(taskset: str, options: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """The task whose wire data (``TaskData.model_dump(mode="json")``) a row carries."""
    config = taskset_config(taskset, options)
    task_type = taskset_class(taskset).task_type()
    return task_type(task_type.data_type().model_validate(dict(data)), config.task)

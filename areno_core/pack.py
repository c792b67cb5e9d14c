"""A plugin declared as tables: :class:`Pack`.

Most plugins only register things: loaders and rewards by name, recipes, algorithms, engines.
Instead of one ``@hookimpl`` function per hook, such a plugin declares what it registers once,
and its entry point names the object::

    # my_pack/plugin.py
    PACK = Pack(
        dataset_loaders={"my_task": my_loader},
        rewards={"my_task": my_reward},
        recipes=RECIPES,
    )

    # pyproject.toml
    [project.entry-points.areno]
    my_pack = "my_pack.plugin:PACK"

A table whose contents are known only when the plugin loads (an installed library's task list,
say) is given as a function of no arguments that returns it; it is called at registration.
A plugin that needs more than tables keeps writing ``@hookimpl`` functions; both kinds load the
same way (docs/plugin-authors.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from areno_core.hookspecs import hookimpl

Named = Mapping[str, Callable[..., Any]] | Callable[[], Mapping[str, Callable[..., Any]]]
Items = Iterable[Any] | Callable[[], Iterable[Any]]


def _named_table(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not (isinstance(value, Mapping) or callable(value)):
        raise TypeError(
            f"Pack({attribute.name}=...) expects a mapping of names to functions (or a "
            f"function returning one), got {type(value).__name__}: {value!r}"
        )


def _item_table(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, Iterator):
        # A generator would be used up by the first registry built in a process.
        raise TypeError(
            f"Pack({attribute.name}=...) got a one-shot {type(value).__name__}, which the "
            "second registry built in a process would find empty; pass a tuple or list, or a "
            "function returning the specs"
        )
    if isinstance(value, str | bytes | Mapping) or not (
        isinstance(value, Iterable) or callable(value)
    ):
        raise TypeError(
            f"Pack({attribute.name}=...) expects a sequence of specs (or a function returning "
            f"one), got {type(value).__name__}: {value!r}"
        )


# Each table and whether it registers by name (``register(name, fn)``) or by spec
# (``register(spec)``); the hook that registers table ``x`` is ``register_x``.
TABLES: dict[str, bool] = {
    "dataset_loaders": True,
    "rewards": True,
    "agents": True,
    "algorithms": False,
    "recipes": False,
    "rollout_engines": False,
    "backends": False,
    "metric_sinks": False,
    "evaluators": False,
}


@attrs.frozen(eq=False)  # compared and hashed by identity, as pluggy needs of a plugin
class Pack:
    """The tables a plugin registers, each through its hook (an empty table registers
    nothing). The fields are the keys of :data:`TABLES`."""

    dataset_loaders: Named = attrs.field(factory=dict, validator=_named_table)
    rewards: Named = attrs.field(factory=dict, validator=_named_table)
    agents: Named = attrs.field(factory=dict, validator=_named_table)
    algorithms: Items = attrs.field(default=(), validator=_item_table)
    recipes: Items = attrs.field(default=(), validator=_item_table)
    rollout_engines: Items = attrs.field(default=(), validator=_item_table)
    backends: Items = attrs.field(default=(), validator=_item_table)
    metric_sinks: Items = attrs.field(default=(), validator=_item_table)
    evaluators: Items = attrs.field(default=(), validator=_item_table)


def _table_hook(field: str, named: bool) -> Callable[[Pack, Callable[..., None]], None]:
    """The hook implementation that registers ``field`` of a :class:`Pack`."""

    def hook(self: Pack, register: Callable[..., None]) -> None:
        table = getattr(self, field)
        table = table() if callable(table) else table
        if named:
            for name, function in table.items():
                register(name, function)
        else:
            for spec in table:
                register(spec)

    hook.__name__ = hook.__qualname__ = f"register_{field}"
    return hookimpl(hook)


for _field, _is_named in TABLES.items():
    setattr(Pack, f"register_{_field}", _table_hook(_field, _is_named))


__all__ = ["TABLES", "Pack"]

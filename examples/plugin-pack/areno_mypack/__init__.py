"""areno-mypack: an example third-party areno plugin (the echo task).

The package's ``pyproject.toml`` declares ``[project.entry-points.areno] mypack = "areno_mypack"``,
so areno imports this module and calls the hook functions below. Each hook receives a
``register`` callback and calls it once per thing it provides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areno_core import hookimpl
from areno_mypack.echo import echo_loader, echo_reward_fn
from areno_mypack.recipes import ECHO_RECIPE

__version__ = "0.1.0"


@hookimpl
def register_dataset_loaders(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register("mypack_echo", echo_loader)


@hookimpl
def register_rewards(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register("mypack_echo", echo_reward_fn)


@hookimpl
def register_recipes(register: Callable[[Any], None]) -> None:
    register(ECHO_RECIPE)

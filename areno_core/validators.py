"""attrs validators for run options, shared by the core and by plugins.

Every message names the option as its flag (``--batch-size``) and says what was expected, so an
error reads the same whether the value came from the command line, a ``--config`` file, a recipe
or a Python call::

    @attrs.frozen
    class MyAlgoConfig:
        my_beta: float = option(0.1, "Temperature of my loss.", validator=number(min=0.0))

``None`` passes a validator when the option's type admits it (``float | None``: "not set") and
is an error otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from areno_core.errors import ConfigError

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def flag(name: str) -> str:
    """The command-line spelling of an option name: ``mini_bs`` -> ``--mini-bs``."""
    return "--" + name.replace("_", "-")


def _fail(attribute: attrs.Attribute[Any], what: str, value: Any) -> None:
    raise ConfigError(f"{flag(attribute.name)} must be {what}, got {value!r}")


def _skip(attribute: attrs.Attribute[Any], value: Any) -> bool:
    """``None`` is "not set" for an option whose type admits it, and an error otherwise."""
    if value is not None:
        return False
    if "None" in str(attribute.type) or attribute.type is None:
        return True
    raise ConfigError(f"{flag(attribute.name)} cannot be empty (null)")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(
    *,
    min: float | None = None,
    max: float | None = None,
    min_inclusive: bool = True,
    integer: bool = False,
) -> Validator:
    """A real number (never a bool), an integer with ``integer``, within the given bounds."""

    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if _skip(attribute, value):
            return
        if integer and (not isinstance(value, int) or isinstance(value, bool)):
            _fail(attribute, "an integer", value)
        if not _is_number(value) or not math.isfinite(value):
            _fail(attribute, "a finite number", value)
        if min is not None and (value < min if min_inclusive else value <= min):
            _fail(attribute, f"{'>=' if min_inclusive else '>'} {min:g}", value)
        if max is not None and value > max:
            _fail(attribute, f"<= {max:g}", value)

    return check


def _numeric(what: str, test: Callable[[float], bool]) -> Validator:
    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if _skip(attribute, value):
            return
        if not (_is_number(value) and math.isfinite(value) and test(value)):
            _fail(attribute, what, value)

    return check


positive = _numeric("positive", lambda v: v > 0)
"""A number greater than zero."""
non_negative = _numeric("zero or more", lambda v: v >= 0)
"""A number of zero or more."""
fraction = _numeric("in (0, 1]", lambda v: 0.0 < v <= 1.0)
"""A number in (0, 1]."""
unit_interval = _numeric("in [0, 1]", lambda v: 0.0 <= v <= 1.0)
"""A number in [0, 1]."""


def boolean(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A real bool (``"yes"`` and ``1`` are refused)."""
    if not _skip(attribute, value) and not isinstance(value, bool):
        _fail(attribute, "true or false", value)


def required(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """Anything but ``None``."""
    if value is None:
        raise ConfigError(f"{flag(attribute.name)} cannot be empty (null)")


def one_of(choices: Sequence[str]) -> Validator:
    """One of ``choices``."""
    listed = ", ".join(choices)

    def check(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not _skip(attribute, value) and value not in choices:
            _fail(attribute, f"one of {listed}", value)

    return check


def all_of(*validators: Validator) -> Validator:
    """Every validator in turn."""
    return attrs.validators.and_(*validators)  # type: ignore[no-any-return]


__all__ = [
    "Validator",
    "all_of",
    "boolean",
    "flag",
    "fraction",
    "non_negative",
    "number",
    "one_of",
    "positive",
    "required",
    "unit_interval",
]

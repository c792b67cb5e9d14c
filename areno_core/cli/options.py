"""Turn the attrs run-config fields into click options, grouped by section in ``--help``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import click
from click.core import ParameterSource

from areno_core.config import SECTION_TITLES, SECTIONS, _base_type, iter_options

_CLICK_TYPES: dict[type, Any] = {int: click.INT, float: click.FLOAT, str: click.STRING}


class SectionedOption(click.Option):
    """A click option that knows which help section it belongs to."""

    def __init__(self, *args: Any, section: str = "other", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section = section


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def default_text(field: attrs.Attribute) -> str | None:
    meta = field.metadata
    if meta.get("default_text"):
        return str(meta["default_text"])
    default = field.default
    if default is None:
        return None
    if isinstance(default, bool):
        if meta.get("negatable"):
            return "enabled" if default else "disabled"
        return None
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def _show_default(field: attrs.Attribute) -> bool | str:
    meta = field.metadata
    if meta.get("default_text"):
        return str(meta["default_text"])
    plain_flag = isinstance(field.default, bool) and not meta.get("negatable")
    return not (field.default is None or plain_flag)


def option_for(section: str, field: attrs.Attribute) -> SectionedOption:
    meta = field.metadata
    target = _base_type(field.type)
    decl = flag_name(field.name)
    kwargs: dict[str, Any] = {
        "help": meta["help"],
        "section": section,
        "default": field.default,
        "show_default": _show_default(field),
    }
    if target is bool:
        if meta.get("negatable"):
            decl = f"{decl}/--no-{field.name.replace('_', '-')}"
        else:
            kwargs["is_flag"] = True
    elif meta.get("choices"):
        kwargs["type"] = click.Choice(list(meta["choices"]))
        kwargs["metavar"] = "[" + "|".join(meta["choices"]) + "]"
    else:
        kwargs["type"] = _CLICK_TYPES[target]
        kwargs["metavar"] = {int: "INTEGER", float: "FLOAT", str: "TEXT"}[target]
    return SectionedOption([decl, field.name], **kwargs)


def add_run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with one option per run-config field."""
    for section, field in reversed(list(iter_options())):
        fn = _attach(fn, option_for(section, field))
    return fn


def _attach(fn: Callable[..., Any], option: click.Option) -> Callable[..., Any]:
    if not hasattr(fn, "__click_params__"):
        fn.__click_params__ = []  # type: ignore[attr-defined]
    fn.__click_params__.append(option)  # type: ignore[attr-defined]
    return fn


def explicit_options(ctx: click.Context) -> dict[str, Any]:
    """The run options the user typed on the command line (or set through the environment)."""
    out: dict[str, Any] = {}
    for _, field in iter_options():
        source = ctx.get_parameter_source(field.name)
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            out[field.name] = ctx.params[field.name]
    return out


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists options under the run-config section titles."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {s: [] for s in [*SECTIONS, "other"]}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            section = getattr(param, "section", "other")
            groups.setdefault(section, []).append(record)
        for section, records in groups.items():
            if not records:
                continue
            title = SECTION_TITLES.get(section, "Other")
            with formatter.section(title):
                doc = (SECTIONS[section].__doc__ or "") if section in SECTIONS else ""
                if doc:
                    formatter.write_text(doc.strip())
                formatter.write_dl(records)

"""Turn run options into click options, grouped by section in ``--help``.

The options of ``areno train`` are not fixed at import: :class:`RunOptionsCommand` asks the
registry of installed plugins for its :class:`~areno_core.options.OptionTable` each time it
parses or prints help, so an algorithm, rollout engine or backend installed as a plugin adds
its own flags (and its own ``--help`` section) without any change to the core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import click
from click.core import ParameterSource

from areno_core.options import OptionTable, Section, base_type

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


def show_default(field: attrs.Attribute) -> bool | str:
    meta = field.metadata
    if meta.get("default_text"):
        return str(meta["default_text"])
    plain_flag = isinstance(field.default, bool) and not meta.get("negatable")
    return not (field.default is None or plain_flag)


def option_for(section: str, field: attrs.Attribute) -> SectionedOption:
    meta = field.metadata
    target = base_type(field)
    decl = flag_name(field.name)
    kwargs: dict[str, Any] = {
        "help": meta["help"],
        "section": section,
        "default": field.default,
        "show_default": show_default(field),
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
        kwargs["metavar"] = (
            meta.get("metavar") or {int: "INTEGER", float: "FLOAT", str: "TEXT"}[target]
        )
    return SectionedOption([decl, field.name], **kwargs)


def run_options(table: OptionTable) -> list[SectionedOption]:
    """One click option per run option of ``table`` (an option several plugins share once)."""
    return [option_for(d.section, d.field) for d in table.declared.values()]


def explicit_options(ctx: click.Context, table: OptionTable) -> dict[str, Any]:
    """The run options the user typed on the command line (or set through the environment)."""
    out: dict[str, Any] = {}
    for name in table.names():
        source = ctx.get_parameter_source(name)
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            out[name] = ctx.params[name]
    return out


def section_help(ctx: click.Context, section: Section) -> list[tuple[str, str]]:
    """``--help`` rows of one section (a shared option shows its owner's own help here)."""
    rows = []
    for field in section.fields:
        record = option_for(section.key, field).get_help_record(ctx)
        if record is not None:
            rows.append(record)
    return rows


class RunOptionsCommand(click.Command):
    """A command that takes every run option of the installed plugins, listed in ``--help``
    under the sections of :class:`OptionTable` (the command's own options under ``Basic``)."""

    def __init__(self, *args: Any, table: Callable[[], OptionTable], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._table = table
        self._cache: tuple[OptionTable, list[SectionedOption]] | None = None

    def option_table(self) -> OptionTable:
        return self._table()

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        table = self.option_table()
        if self._cache is None or self._cache[0] is not table:
            self._cache = (table, run_options(table))
        return [*self._cache[1], *super().get_params(ctx)]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            raise self._no_such_option(ctx, exc) from None

    def _no_such_option(self, ctx: click.Context, exc: click.NoSuchOption) -> click.UsageError:
        """click's error for an unknown flag, with the suggestions of the ``--config`` path
        (``--learning-rate`` -> ``--lr``) instead of click's own spelling matches."""
        if not exc.option_name.startswith("--"):
            return exc
        own = [opt[2:] for p in super().get_params(ctx) for opt in p.opts if opt.startswith("--")]
        close = self.option_table().suggest(exc.option_name, extra=own)
        if not close:
            return click.NoSuchOption(exc.option_name, ctx=ctx)
        names = ", ".join(repr(flag_name(n)) for n in close)
        hint = f"Did you mean {names}?" if len(close) == 1 else f"(Did you mean one of: {names}?)"
        return click.NoSuchOption(
            exc.option_name, message=f"No such option {exc.option_name!r}. {hint}", ctx=ctx
        )

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        table = self.option_table()
        own: dict[str, list[tuple[str, str]]] = {}
        for param in super().get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                own.setdefault(getattr(param, "section", "other"), []).append(record)
        for section in table.sections:
            rows = section_help(ctx, section) + own.pop(section.key, [])
            if not rows:
                continue
            with formatter.section(section.title):
                if section.doc:
                    formatter.write_text(section.doc)
                formatter.write_dl(rows)
        for records in own.values():
            with formatter.section("Other"):
                formatter.write_dl(records)

"""The option table: declarations, conflicts between plugins, lookups and value conversion; and
the shared validators."""

from __future__ import annotations

import attrs
import pytest

from areno_core.config import OPTION_SECTIONS, core_option_table
from areno_core.errors import ConfigError, PluginError
from areno_core.options import (
    OptionTable,
    Owner,
    Section,
    check_config_class,
    coerce_value,
    make_options,
    option,
)
from areno_core.validators import (
    boolean,
    fraction,
    non_negative,
    number,
    one_of,
    positive,
    unit_interval,
)


@attrs.frozen
class AlphaConfig:
    knob: float = option(0.5, "A knob.", validator=number(min=0.0))
    mode: str = option("a", "A mode.", choices=("a", "b"))


@attrs.frozen
class BetaConfig:
    knob: float = option(0.5, "The same knob, described by another plugin.")


@attrs.frozen
class GammaConfig:
    knob: float = option(0.7, "A knob with another default.")


def _section(cls: type, kind: str, name: str, dist: str) -> Section:
    owner = Owner(kind, name, dist)
    return Section(f"x:{name}", name, "", tuple(attrs.fields(cls)), owner)


def _table(*sections: Section) -> OptionTable:
    return OptionTable([*core_option_table().sections, *sections])


def test_core_table_holds_every_core_option_once():
    table = core_option_table()
    assert table.names() == list(OPTION_SECTIONS)
    assert all(table.is_core(name) for name in table.names())
    assert table.default("mini_bs") == 16


def test_shared_option_with_same_shape_lists_both_owners():
    table = _table(
        _section(AlphaConfig, "algorithm", "alpha", "pack-a"),
        _section(BetaConfig, "algorithm", "beta", "pack-b"),
    )
    assert [o.name for o in table.owners("knob")] == ["alpha", "beta"]
    assert table.field("knob").metadata["help"] == "A knob."  # the first declaration
    assert dict(table.plugin_options()).keys() == {"knob", "mode"}


def test_shared_option_with_other_default_is_plugin_error_naming_both():
    with pytest.raises(PluginError) as info:
        _table(
            _section(AlphaConfig, "algorithm", "alpha", "pack-a"),
            _section(GammaConfig, "rollout engine", "gamma", "pack-c"),
        )
    text = str(info.value)
    assert "option --knob is declared differently by algorithm alpha (pack-a)" in text
    assert "(float, default 0.5) and by rollout engine gamma (pack-c) (float, default 0.7)" in text


def test_plugin_redeclaring_a_core_option_is_plugin_error():
    @attrs.frozen
    class Clash:
        seed: int = option(1, "My own seed.")

    with pytest.raises(PluginError, match="algorithm c .*declares the option --seed, which"):
        _table(_section(Clash, "algorithm", "c", "pack-c"))


def test_check_name_normalizes_and_suggests():
    table = _table(_section(AlphaConfig, "algorithm", "alpha", "pack-a"))
    assert table.check_name("--max-new-tokens") == "max_new_tokens"
    assert table.check_name("knob") == "knob"
    with pytest.raises(ConfigError, match=r"unknown option 'knb'. Did you mean knob\?"):
        table.check_name("knb")
    with pytest.raises(ConfigError, match="^somewhere: unknown option 'zzz'.$"):
        table.check_name("zzz", where="somewhere")


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("knob", 1, 1.0),
        ("knob", "0.25", 0.25),
        ("mode", "b", "b"),
    ],
)
def test_coerce_value_converts_to_the_declared_type(field, value, expected):
    got = coerce_value(attrs.fields_dict(AlphaConfig)[field], value)
    assert got == expected and type(got) is type(expected)


def test_coerce_value_refuses_bools_for_numbers_and_null_for_required():
    knob = attrs.fields_dict(AlphaConfig)["knob"]
    with pytest.raises(ConfigError, match="--knob expects float, got True"):
        coerce_value(knob, True)
    with pytest.raises(ConfigError, match=r"--knob cannot be empty \(null\)"):
        coerce_value(knob, None)


def test_make_options_reads_declared_fields_from_mapping_or_object():
    assert make_options(AlphaConfig, {"knob": 2.0, "lr": 1.0}) == AlphaConfig(knob=2.0)

    class Run:
        mode = "b"
        other = 3

    assert make_options(AlphaConfig, Run()) == AlphaConfig(mode="b")
    with pytest.raises(ConfigError, match="--mode must be one of a, b, got 'c'"):
        make_options(AlphaConfig, {"mode": "c"})


def test_check_config_class_requires_defaults_help_and_plain_types():
    @attrs.frozen
    class NoDefault:
        x: int = attrs.field(metadata={"help": "x"})

    @attrs.frozen
    class NoHelp:
        x: int = 1

    @attrs.frozen
    class ListType:
        x: tuple = option((), "a tuple")

    check_config_class(AlphaConfig, "algorithm a")
    with pytest.raises(PluginError, match="algorithm a: option 'x' needs a default value"):
        check_config_class(NoDefault, "algorithm a")
    with pytest.raises(PluginError, match="option 'x' has no help text"):
        check_config_class(NoHelp, "algorithm a")
    with pytest.raises(PluginError, match="options are bool, int, float or str"):
        check_config_class(ListType, "algorithm a")
    with pytest.raises(PluginError, match="config_cls must be an attrs class"):
        check_config_class(dict, "algorithm a")


# -- validators ------------------------------------------------------------------------------


@attrs.define
class V:
    pos: float = attrs.field(default=1.0, validator=positive)
    nonneg: float = attrs.field(default=0.0, validator=non_negative)
    frac: float = attrs.field(default=1.0, validator=fraction)
    unit: float = attrs.field(default=0.0, validator=unit_interval)
    flag: bool = attrs.field(default=False, validator=boolean)
    pick: str = attrs.field(default="a", validator=one_of(("a", "b")))
    count: int | None = attrs.field(default=None, validator=number(min=1, integer=True))
    beta: float = attrs.field(default=1.0, validator=number(min=0.0, min_inclusive=False, max=2))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pos": 0.0}, "--pos must be positive, got 0.0"),
        ({"pos": float("inf")}, "--pos must be positive, got inf"),
        ({"nonneg": -1}, "--nonneg must be zero or more, got -1"),
        ({"frac": 0.0}, r"--frac must be in \(0, 1\], got 0.0"),
        ({"unit": 1.5}, r"--unit must be in \[0, 1\], got 1.5"),
        ({"flag": 1}, "--flag must be true or false, got 1"),
        ({"pick": "c"}, "--pick must be one of a, b, got 'c'"),
        ({"count": 0}, "--count must be >= 1, got 0"),
        ({"count": 2.0}, "--count must be an integer, got 2.0"),
        ({"beta": 0.0}, "--beta must be > 0, got 0.0"),
        ({"beta": 3.0}, "--beta must be <= 2, got 3.0"),
        ({"beta": True}, "--beta must be a finite number, got True"),
        ({"beta": None}, r"--beta cannot be empty \(null\)"),
    ],
)
def test_validators_name_the_flag_and_the_expectation(changes, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        V(**changes)


def test_validators_accept_good_values_and_none_where_the_type_allows_it():
    assert V(pos=2, nonneg=0, frac=1.0, unit=1.0, flag=True, pick="b", count=None, beta=2.0)
    assert V(count=3).count == 3

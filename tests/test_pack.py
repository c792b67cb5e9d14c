"""A plugin declared as tables (areno_core.pack.Pack), loaded like any plugin."""

from __future__ import annotations

import attrs
import pytest

from areno_core import Pack
from areno_core.pack import TABLES
from areno_core.plugins import get_plugin_manager
from areno_core.registry import Registry

TABLE_PACK = """
from areno_core import Pack


def short_rows(row):
    return {"prompt": row["q"], "answer": row["a"]}


def length_reward(record):
    return float(len(record.completion))


PACK = Pack(dataset_loaders={"short_rows": short_rows}, rewards={"length": length_reward})
"""


def _registry(monkeypatch: pytest.MonkeyPatch, pack: Pack) -> Registry:
    monkeypatch.setenv("ARENO_PLUGINS", "")  # the core and this pack only
    pm = get_plugin_manager()
    assert pm.register_plugin(pack, "tables")
    return Registry(pm)


def test_entry_point_naming_a_pack_registers_its_tables(install_areno_plugin, monkeypatch):
    monkeypatch.setenv("ARENO_PLUGINS", "table-pack")
    registry = install_areno_plugin(
        "table-pack", "table_pack", TABLE_PACK, entry_point_object="PACK"
    )
    assert not registry.failures
    assert registry.provided_by("table_pack") == {
        "dataset_loaders": ["short_rows"],
        "rewards": ["length"],
    }
    loader = registry.get("dataset_loaders", "short_rows")
    assert loader({"q": "1+1", "a": "2"}) == {"prompt": "1+1", "answer": "2"}


def test_a_table_given_as_a_function_is_read_when_the_plugin_registers(monkeypatch):
    calls: list[str] = []

    def loaders():
        calls.append("loaders")
        return {f"task/{n}": (lambda row: row) for n in ("a", "b")}

    pack = Pack(dataset_loaders=loaders, algorithms=lambda: [])
    assert calls == []  # declaring the pack reads nothing
    registry = _registry(monkeypatch, pack)
    assert calls == ["loaders"]
    assert registry.provided_by("tables") == {"dataset_loaders": ["task/a", "task/b"]}


def test_every_table_has_its_hook_and_an_empty_table_registers_nothing(monkeypatch):
    assert [f.name for f in attrs.fields(Pack)] == list(TABLES)
    registry = _registry(monkeypatch, Pack())
    assert registry.provided_by("tables") == {}
    assert not registry.failures


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rewards", [len], r"Pack\(rewards=\.\.\.\) expects a mapping of names to functions"),
        ("dataset_loaders", "gsm8k", r"expects a mapping .* got str: 'gsm8k'"),
        ("recipes", "math/arith", r"Pack\(recipes=\.\.\.\) expects a sequence of specs"),
        ("algorithms", {"grpo": None}, r"Pack\(algorithms=\.\.\.\) expects a sequence .* got dict"),
        ("evaluators", 3, r"expects a sequence of specs .* got int: 3"),
        ("recipes", (r for r in ()), r"Pack\(recipes=\.\.\.\) got a one-shot generator"),
    ],
)
def test_a_table_of_the_wrong_kind_is_refused_naming_the_field(field, value, message):
    with pytest.raises(TypeError, match=message):
        Pack(**{field: value})

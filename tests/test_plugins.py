from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from areno_core import hookimpl
from areno_core.errors import ConfigError
from areno_core.plugins import get_plugin_manager
from areno_core.registry import Registry

REWARD_PACK = """
from areno_core import hookimpl

@hookimpl
def register_rewards(register):
    register("length_reward", lambda record: float(len(record.completion)))
"""


@pytest.fixture
def registry_with(monkeypatch) -> Callable[[object, str], Registry]:
    """``registry_with(plugin, name)``: a registry of the core and one in-process plugin object,
    no installed plugin (``ARENO_PLUGINS`` empty)."""
    monkeypatch.setenv("ARENO_PLUGINS", "")

    def build(plugin: object, name: str) -> Registry:
        pm = get_plugin_manager()
        pm.register_plugin(plugin, name)
        return Registry(pm)

    return build


def test_entry_point_plugin_installed_as_distribution_appears_in_registry(
    install_areno_plugin, monkeypatch
):
    monkeypatch.setenv("ARENO_PLUGINS", "third-party-rewards")
    registry = install_areno_plugin("third-party-rewards", "tp_rewards", REWARD_PACK, "1.2.3")
    infos = {p.distribution: p for p in registry.plugins()}
    assert infos["third-party-rewards"].version == "1.2.3"
    assert registry.provided_by("tp_rewards") == {"rewards": ["length_reward"]}
    fn = registry.get("rewards", "length_reward")

    class Rec:
        completion = "abcd"

    assert fn(Rec()) == 4.0


def test_plugin_import_error_is_reported_and_skipped(install_areno_plugin, monkeypatch):
    monkeypatch.setenv("ARENO_PLUGINS", "broken-pack,third-party-rewards")
    install_areno_plugin("third-party-rewards", "tp_rewards2", REWARD_PACK)
    registry = install_areno_plugin("broken-pack", "broken_pack", "import no_such_module_xyz\n")
    [failure] = registry.failures
    assert failure.distribution == "broken-pack"
    assert "ModuleNotFoundError" in failure.error and "no_such_module_xyz" in failure.error
    assert registry.names("rewards") == ["length_reward"]


def test_misspelt_hook_name_is_rejected_with_suggestion(install_areno_plugin, monkeypatch):
    monkeypatch.setenv("ARENO_PLUGINS", "typo-pack")
    source = """
from areno_core import hookimpl

@hookimpl
def register_reward(register):
    register("x", lambda r: 0.0)
"""
    registry = install_areno_plugin("typo-pack", "typo_pack", source)
    [failure] = registry.failures
    assert "unknown hook 'register_reward'" in failure.error
    assert "unknown hook 'register_reward'. Did you mean 'register_rewards'?" in failure.error
    assert registry.names("rewards") == []


TWO_KIND_PACK = """
from areno_core import hookimpl

@hookimpl
def register_rewards(register):
    register("length_reward", lambda record: 2.0)

@hookimpl
def register_agents(register):
    register("echo_agent", lambda ctx, batch: None)
"""


def test_duplicate_name_later_plugin_recorded_as_failed_rest_works(
    install_areno_plugin, monkeypatch
):
    monkeypatch.setenv("ARENO_PLUGINS", "pack-one,pack-two")
    install_areno_plugin("pack-one", "pack_one", REWARD_PACK)
    registry = install_areno_plugin("pack-two", "pack_two", TWO_KIND_PACK, "2.0")
    [failure] = registry.failures
    assert failure.distribution == "pack-two" and failure.version == "2.0"
    assert failure.error.startswith(
        "reward 'length_reward' is registered twice: by pack-one 0.0.1 (plugin 'pack_one') and "
        "by pack-two 2.0 (plugin 'pack_two'); the later plugin's rewards are not loaded."
    )
    # The first registration stands; the clashing hook of the later plugin is dropped whole,
    # and its other hooks still register.
    assert registry.provided_by("pack_one") == {"rewards": ["length_reward"]}
    assert registry.provided_by("pack_two") == {"agents": ["echo_agent"]}

    class Rec:
        completion = "abc"

    assert registry.get("rewards", "length_reward")(Rec()) == 3.0


def test_duplicate_name_areno_plugins_command_lists_the_failure(install_areno_plugin, monkeypatch):
    from click.testing import CliRunner

    from areno_core.cli.main import cli

    monkeypatch.setenv("ARENO_PLUGINS", "pack-one,pack-two")
    install_areno_plugin("pack-one", "pack_one", REWARD_PACK)
    install_areno_plugin("pack-two", "pack_two", REWARD_PACK, "2.0")
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [p["distribution"] for p in report["plugins"] if p["registered"]] == [
        "areno-core",
        "pack-one",
    ]
    [failure] = report["failures"]
    assert failure["distribution"] == "pack-two"
    assert "reward 'length_reward' is registered twice" in failure["error"]
    table = CliRunner().invoke(cli, ["plugins"])
    assert table.exit_code == 0
    assert "failed: plugin 'pack_two' from pack-two 2.0: reward 'length_reward'" in " ".join(
        table.output.split()
    )


def test_duplicate_name_within_one_hook_recorded_as_failed(registry_with):
    class Twice:
        @hookimpl
        def register_rewards(self, register):
            register("r", lambda record: 1.0)
            register("r", lambda record: 0.0)

    registry = registry_with(Twice(), "twice")
    [failure] = registry.failures
    assert "reward 'r' is registered twice" in failure.error
    assert registry.names("rewards") == []


def test_block_list_env_disables_named_plugin(install_areno_plugin, monkeypatch):
    monkeypatch.delenv("ARENO_PLUGINS", raising=False)
    monkeypatch.setenv("ARENO_DISABLE_PLUGINS", "blocked-pack")
    registry = install_areno_plugin("blocked-pack", "blocked_pack", REWARD_PACK)
    assert "blocked-pack" not in {p.distribution for p in registry.plugins()}


def test_allow_list_empty_loads_no_plugins(monkeypatch):
    monkeypatch.setenv("ARENO_PLUGINS", "")
    registry = Registry(get_plugin_manager())
    assert [p.distribution for p in registry.plugins()] == ["areno-core"]
    assert registry.names("rollout_engines") == ["native"]
    with pytest.raises(ConfigError, match="No algorithms are registered. Install them with"):
        registry.algorithm("gspo")


def test_trace_env_logs_hook_calls(registry_with, monkeypatch, caplog):
    monkeypatch.setenv("ARENO_TRACE_PLUGINS", "1")

    class Local:
        @hookimpl
        def register_agents(self, register):
            register("noop", lambda ctx, batch: None)

    with caplog.at_level("DEBUG", logger="areno.plugins"):
        registry = registry_with(Local(), "local")
    assert registry.names("agents") == ["noop"]
    assert any("register_agents" in r.getMessage() for r in caplog.records)


def test_hook_that_raises_is_reported_not_fatal(registry_with):
    class Bad:
        @hookimpl
        def register_recipes(self, register):
            raise RuntimeError("boom")

    registry = registry_with(Bad(), "bad")
    assert registry.failures[0].error == "register_recipes failed: RuntimeError: boom"


def test_register_with_wrong_arguments_fails_that_plugin_only(registry_with):
    class Wrong:
        @hookimpl
        def register_algorithms(self, register):
            register("not a spec")

    registry = registry_with(Wrong(), "wrong")
    [failure] = registry.failures
    assert failure.name == "wrong"
    assert failure.error == (
        "register_algorithms: plugin <local> (plugin 'wrong'): register() for algorithms "
        "takes one AlgorithmSpec, got str"
    )
    assert registry.names("algorithms") == []
    assert registry.names("rollout_engines") == ["native"]  # the rest works


def test_unknown_name_lookup_suggests_close_names(toy_registry):
    with pytest.raises(ConfigError, match=r"unknown algorithm 'tyo'\. Did you mean 'toy'\?"):
        toy_registry.algorithm("tyo")


def test_core_source_names_no_algorithm():
    """The core learns what an algorithm needs from its spec, never from its name: no string in
    areno_core's code (docstrings aside) is an algorithm name, and nothing imports areno_algos.
    The exceptions are the default of --algo, which the CLI reference fixes to gspo, and the
    GPU acceptance check, which runs ``areno train --algo grpo`` as a user would (the issue
    that asked for it names GRPO); it is a client of the core, not part of its logic."""
    import ast
    from pathlib import Path

    import areno_core

    names = {"sft", "dpo", "grpo", "gspo", "rloo", "ppo"}
    found = []
    root = Path(areno_core.__file__).parent
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                modules.append(getattr(node, "module", None) or "")
                found += [f"{path.name}: import {m}" for m in modules if "areno_algos" in m]
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and node.value.strip().lower() in names
            ):
                found.append(f"{path.relative_to(root)}: {node.value!r}")
    assert found == ["config.py: 'gspo'", "gpu_check.py: 'grpo'"]

"""The pack's registrations and what ``areno train`` does with them before any model loads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from areno_envs.rg.recipes import RG_EVAL, RG_TRAIN
from areno_envs.rg.tasks import task_names

from areno_core.cli.main import main
from areno_core.plugins import get_plugin_manager
from areno_core.recipe import resolve_resource
from areno_core.registry import Registry, get_registry
from areno_core.testing import run_areno

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


def test_every_installed_task_is_a_recipe_with_its_loader() -> None:
    registry = get_registry()
    assert not [f for f in registry.failures if "envs" in f.name]
    public = {r.name for r in registry.recipes()}
    for task in task_names():
        assert f"rg/{task}" in public
        recipe = registry.recipe(f"rg/{task}")
        assert recipe.loader == f"rg/{task}" and recipe.reward == "rg"
        assert registry.get("dataset_loaders", f"rg/{task}")
    assert registry.get("dataset_loaders", "rg") and registry.get("rewards", "rg")


def test_registration_does_not_import_reasoning_gym(monkeypatch) -> None:
    # With every reasoning_gym import failing, the pack still registers every task: areno
    # starts without paying reasoning-gym's import (about 4 s) until a task is built.
    for name in [m for m in sys.modules if m == "reasoning_gym" or m.startswith("reasoning_gym.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    registry = Registry(get_plugin_manager())
    assert not [f for f in registry.failures if "envs" in f.name]
    assert {f"rg/{t}" for t in task_names()} <= {r.name for r in registry.recipes()}


def test_dry_run_shows_what_the_recipe_sets(capsys) -> None:
    run_areno("train", "--recipe", "rg/countdown", "--algo", "grpo", "--dry-run")
    out = capsys.readouterr().out
    for text in ("dataset_loader_fn: rg/countdown", "reward_fn_path: rg", "algo: grpo",
                 "ckpt: Qwen/Qwen3-0.6B"):  # fmt: skip
        assert text in out, text
    assert Path(resolve_resource(RG_TRAIN)).is_file() and Path(resolve_resource(RG_EVAL)).is_file()


def _error_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code not in (0, None)
    return capsys.readouterr().err


def test_unknown_task_recipe_is_named(tmp_path, capsys) -> None:
    save = tmp_path / "run"
    err = _error_of(["train", "--recipe", "rg/chain_summ", "--algo", "grpo", "--save-path",
                     str(save)], capsys)  # fmt: skip
    assert "unknown recipe 'rg/chain_summ'. Did you mean 'rg/chain_sum'" in err
    assert not save.exists()


def test_bad_task_option_fails_before_the_model_loads(tmp_path, capsys) -> None:
    spec = tmp_path / "spec.jsonl"
    spec.write_text('{"size": 5, "config": {"max_term": 3}}\n')
    save = tmp_path / "run"
    # The recipe's checkpoint is a hub model: an error after loading rows would name the hub.
    err = _error_of(["train", "--recipe", "rg/chain_sum", "--algo", "grpo", "--dataset-path",
                     str(spec), "--save-path", str(save)], capsys)  # fmt: skip
    assert "task 'chain_sum' has no option 'max_term'. Did you mean 'max_terms'" in " ".join(
        err.split()
    )
    assert not save.exists()


def test_cpu_recipes_resolve_to_shipped_files_and_the_warm_start_matches_its_provenance() -> None:
    import json

    from areno_envs.rg.recipes import CHAIN_SUM, CHAIN_SUM_SFT, CHAIN_SUM_SMOKE, CHAIN_WARMSTART

    from areno_core.models.warmstart import PROVENANCE_FILE, sha256

    options = CHAIN_SUM.options_for("gspo")
    assert Path(options["dataset_path"]).is_file() and Path(options["eval_dataset_path"]).is_file()
    assert options["dataset_loader_fn"] == "rg/chain_sum" and options["reward_fn_path"] == "rg"
    ckpt = Path(resolve_resource(CHAIN_WARMSTART))
    provenance = json.loads((ckpt / PROVENANCE_FILE).read_text())
    assert provenance["model_sha256"] == sha256(ckpt / "model.safetensors")
    assert provenance["command"].startswith("areno train --recipe rg-cpu/chain_sum-sft")
    assert CHAIN_SUM_SFT.options_for("sft", rollout=False)["ckpt"].startswith("random:qwen3")
    assert CHAIN_SUM_SMOKE.internal and CHAIN_SUM_SMOKE.gates
    assert CHAIN_SUM.hardware.device == "cpu" and CHAIN_SUM.gates


def test_env_args_reach_the_recipes_loader_and_a_bad_one_is_named(tmp_path, capsys) -> None:
    save = tmp_path / "run"
    err = _error_of(["train", "--recipe", "rg/chain_sum", "--algo", "grpo", "--env-args",
                     '{"max_digits": "two"}', "--save-path", str(save)], capsys)  # fmt: skip
    assert "option 'max_digits' expects an integer (its default is 4), got 'two'" in " ".join(
        err.split()
    )
    assert not save.exists()
    err = _error_of(["train", "--recipe", "math/arith", "--algo", "gspo", "--env-args", "{}",
                     "--save-path", str(save)], capsys)  # fmt: skip
    assert "takes no env_args keyword" in " ".join(err.split())


def test_basic_arithmetic_recipes_ship_their_files_and_a_held_out_split_of_the_same_kind() -> None:
    import json
    import re

    from areno_envs.rg.loader import task_loader
    from areno_envs.rg.recipes import ADD, ADD_LEARN, ADD_SFT, ADD_WARMSTART

    from areno_core.data import load_rows
    from areno_core.models.warmstart import PROVENANCE_FILE, sha256

    options = ADD.options_for("gspo")
    assert options["dataset_loader_fn"] == "rg/basic_arithmetic"
    assert options["reward_fn_path"] == "rg"
    ckpt = Path(resolve_resource(ADD_WARMSTART))
    provenance = json.loads((ckpt / PROVENANCE_FILE).read_text())
    assert provenance["model_sha256"] == sha256(ckpt / "model.safetensors")
    assert "areno train --recipe rg-cpu/basic_arithmetic-sft" in provenance["command"]
    assert ADD_SFT.options_for("sft", rollout=False)["max_steps"] == 700
    assert ADD_LEARN.internal and ADD_LEARN.options_for("gspo")["max_steps"] == 150
    # Held out: no training question, and the same kind of problem (two terms up to 100, '+').
    load = task_loader("basic_arithmetic")
    train = [r for spec in load_rows(options["dataset_path"]) for r in load(spec)]
    held = [r for spec in load_rows(options["eval_dataset_path"]) for r in load(spec)]
    assert (len(train), len(held)) == (5000, 609)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    kind = re.compile(r"Calculate (\d+) \+ (\d+)\. ")
    for row in train[:500] + held:
        a, b = map(int, kind.fullmatch(row["prompt"]).groups())
        assert max(a, b) <= 100 and row["answer"] == str(a + b)

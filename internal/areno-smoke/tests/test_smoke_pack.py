"""The internal smoke pack: its recipes stay internal, cover every algorithm, and the runner
runs a recipe through `areno train`, gates it, and exits non-zero on a failed gate."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from areno_core.plugins import get_plugin_manager
from areno_core.registry import Registry, set_registry

pytest.importorskip("areno_smoke", reason="install it: pip install -e internal/areno-smoke")

from areno_smoke.recipes import SMOKE_RECIPES
from areno_smoke.runner import main, run_matrix, smoke_recipes


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.delenv("ARENO_PLUGINS", raising=False)
    monkeypatch.delenv("ARENO_DISABLE_PLUGINS", raising=False)
    set_registry(None)
    registry = Registry(get_plugin_manager())
    set_registry(registry)
    yield registry
    set_registry(None)


def test_smoke_recipes_are_internal_and_hidden_from_public_listing(registry):
    names = {r.name for r in smoke_recipes(registry)}
    assert names == {r.name for r in SMOKE_RECIPES}
    assert all(r.internal for r in SMOKE_RECIPES)
    assert not names & {r.name for r in registry.recipes()}


def test_smoke_recipes_cover_every_registered_algorithm(registry):
    covered = {a for r in smoke_recipes(registry) for a in r.algorithms}
    assert set(registry.names("algorithms")) <= covered
    assert {"sft", "dpo", "grpo", "gspo", "rloo", "ppo"} <= covered


def test_smoke_recipes_use_package_files_not_paths():
    for recipe in SMOKE_RECIPES:
        options = recipe.options_for(recipe.algorithms[0])
        assert recipe.dataset is not None and recipe.dataset.startswith("resource:areno_smoke/")
        assert options["dataset_path"].endswith("areno_smoke/data/arith.jsonl")
        assert recipe.gates and any(g.kind == "checkpoint_loadable" for g in recipe.gates)


def test_smoke_distribution_is_marked_never_publish():
    classifiers = metadata.metadata("areno-smoke").get_all("Classifier") or []
    assert "Private :: Do Not Upload" in classifiers


def test_runner_single_recipe_passes_and_reports_json(registry, tmp_path, capsys):
    report_path = tmp_path / "smoke.json"
    code = main(
        ["--only", "smoke/sft", "--keep", str(tmp_path / "runs"), "--json", str(report_path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "areno smoke matrix" in out and "1/1 passed" in out
    report = json.loads(report_path.read_text())
    (row,) = report["rows"]
    assert (row["recipe"], row["algo"], row["status"]) == ("smoke/sft", "sft", "pass")
    kinds = {g["kind"] for g in row["gates"]}
    assert {"finite", "falls", "checkpoint_loadable"} <= kinds
    assert all(g["passed"] for g in row["gates"]) and row["seconds"] > 0
    assert (tmp_path / "runs" / "smoke-sft-sft" / "latest").read_text().strip() == "step_6"


FAILING_PACK = """
from areno_core import hookimpl
from areno_core.recipe import Gate, Recipe

# Both train the tiny model on the smoke pack's SFT rows.
SFT_ROWS = dict(
    dataset="resource:areno_smoke/data/arith.jsonl",
    loader="smoke_sft",
    checkpoint="random:qwen3-tiny",
    visibility="internal",
)
IMPOSSIBLE = Recipe(
    name="failing/sft",
    summary="an SFT run whose gate cannot pass",
    algorithms=("sft",),
    defaults={"max_steps": 1, "batch_size": 4, "mini_bs": 4, "max_new_tokens": 16,
              "activation_checkpointing": False},
    gates=(Gate("finite", "train/loss"), Gate("at_least", "train/loss", threshold=1.0e9)),
    **SFT_ROWS,
)
# SFT rows under DPO: the loader's rows lack chosen/rejected, so the run fails.
BROKEN = Recipe(
    name="failing/dpo", summary="a DPO run whose rows do not fit", algorithms=("dpo",), **SFT_ROWS
)


@hookimpl
def register_recipes(register):
    register(IMPOSSIBLE)
    register(BROKEN)
"""


def test_runner_failed_gate_and_failed_run_exit_nonzero(install_areno_plugin, tmp_path, capsys):
    install_areno_plugin("failing-pack", "failing_pack", FAILING_PACK)
    report_path = tmp_path / "failing.json"
    code = main(["--pack", "failing", "--no-coverage", "--json", str(report_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "0/2 passed" in out and "FAILED" in out
    rows = {r["recipe"]: r for r in json.loads(report_path.read_text())["rows"]}
    gate_row = rows["failing/sft"]
    assert gate_row["status"] == "fail"
    failed = [g for g in gate_row["gates"] if not g["passed"]]
    assert [g["kind"] for g in failed] == ["at_least"]
    assert "< 1e+09" in failed[0]["reason"]
    error_row = rows["failing/dpo"]
    assert error_row["status"] == "error"
    assert "areno train exited 2" in error_row["detail"] and "chosen" in error_row["detail"]


TOY_ALGO = """
import attrs
from areno_core import hookimpl
from areno_core.algorithm import AlgorithmSpec, RowSchema


@attrs.define
class ToyConfig:
    pass


TOY = AlgorithmSpec(
    name="toy", summary="toy", kind="supervised",
    row_schema=RowSchema(required={"prompt": (str,)}), config_cls=ToyConfig,
    loss=lambda outputs, batch, config: (outputs["logprobs"].sum() * 0, {}),
)


@hookimpl
def register_algorithms(register):
    register(TOY)
"""


def test_runner_algorithm_without_smoke_recipe_is_a_missing_row(install_areno_plugin, tmp_path):
    registry = install_areno_plugin("toy-algo", "toy_algo_for_smoke", TOY_ALGO)
    rows = run_matrix(smoke_recipes(registry)[:0], tmp_path, registry=registry)
    missing = [r for r in rows if r.status == "missing"]
    assert "toy" in {r.algo for r in missing}
    assert all(not r.passed for r in missing)


def _history(run, rewards):
    metrics = run / "tensorboard"
    metrics.mkdir(parents=True)
    lines = [
        json.dumps({"step": i + 1, "rollout/reward_mean": r, "train/loss": 0.1})
        for i, r in enumerate(rewards)
    ]
    (metrics / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_agentic_smoke_gate_fails_when_the_reward_does_not_move(registry, tmp_path):
    pytest.importorskip("areno_recipes_agentic")
    from areno_core.gates import check_run

    recipes = {r.name: r for r in smoke_recipes(registry, "agentic")}
    learning = recipes["agentic/tictactoe-cpu-smoke"]
    (rises,) = [g for g in learning.gates if g.kind == "rises"]
    assert rises.metric == "rollout/reward_mean" and rises.threshold > 0
    flat = _history(tmp_path / "flat", [0.42, 0.44, 0.43, 0.41, 0.44, 0.42])
    rising = _history(tmp_path / "rising", [0.40, 0.42, 0.45, 0.47, 0.50, 0.52])
    assert not check_run([rises], flat).passed
    assert check_run([rises], rising).passed


def test_reasoning_gym_learning_gate_fails_when_held_out_accuracy_does_not_rise(registry, tmp_path):
    pytest.importorskip("areno_envs")
    from areno_core.gates import check_run

    recipes = {r.name: r for r in smoke_recipes(registry, "rg-cpu")}
    learning = recipes["rg-cpu/basic_arithmetic-learn"]
    (held_out,) = [g for g in learning.gates if g.metric == "eval/accuracy"]
    assert held_out.kind == "rises" and held_out.threshold > 0
    # Evaluated at steps 0, 50, 100 and 150: the gate compares step 150 with step 0.
    options = learning.options_for("gspo")
    assert (options["eval_interval"], options["max_steps"]) == (50, 150)
    flat, rising = tmp_path / "flat" / "tensorboard", tmp_path / "rising" / "tensorboard"
    for run, accuracies in ((flat, [0.34, 0.36, 0.33, 0.37]), (rising, [0.34, 0.40, 0.50, 0.52])):
        run.mkdir(parents=True)
        rows = [{"step": 50 * i, "eval/accuracy": a} for i, a in enumerate(accuracies)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert not check_run([held_out], flat.parent).passed
    assert check_run([held_out], rising.parent).passed

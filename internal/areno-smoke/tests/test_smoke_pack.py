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


def _history(run, metric, values, every):
    """A run whose metrics.jsonl logs ``metric`` at steps 0, every, 2 * every, ..."""
    metrics = run / "tensorboard"
    metrics.mkdir(parents=True)
    rows = [{"step": every * i, metric: v, "train/loss": 0.1} for i, v in enumerate(values)]
    (metrics / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


# Each opt-in learning gate fails on a flat history of its metric and passes on a rising one.
# The reasoning-gym gate compares held-out accuracy at step 150 with step 0 (evaluated every 50).
LEARNING_GATES = [
    pytest.param(
        "areno_recipes_agentic",
        "agentic",
        "agentic/tictactoe-cpu-smoke",
        "rollout/reward_mean",
        1,
        ([0.42, 0.44, 0.43, 0.41, 0.44, 0.42], [0.40, 0.42, 0.45, 0.47, 0.50, 0.52]),
        id="tictactoe-sampled-reward",
    ),
    pytest.param(
        "areno_envs",
        "rg-cpu",
        "rg-cpu/basic_arithmetic-learn",
        "eval/accuracy",
        50,
        ([0.34, 0.36, 0.33, 0.37], [0.34, 0.40, 0.50, 0.52]),
        id="reasoning-gym-held-out-accuracy",
    ),
]


@pytest.mark.parametrize(
    ("package", "pack", "name", "metric", "every", "histories"), LEARNING_GATES
)
def test_learning_gate_fails_when_its_metric_does_not_rise(
    registry, tmp_path, package, pack, name, metric, every, histories
):
    pytest.importorskip(package)
    from areno_core.gates import check_run

    learning = {r.name: r for r in smoke_recipes(registry, pack)}[name]
    (rises,) = [g for g in learning.gates if g.kind == "rises" and g.metric == metric]
    assert rises.threshold > 0
    if metric == "eval/accuracy":
        options = learning.options_for(learning.algorithms[0])
        assert (options["eval_interval"], options["max_steps"]) == (every, every * 3)
    flat, rising = (
        _history(tmp_path / kind, metric, values, every)
        for kind, values in zip(("flat", "rising"), histories, strict=True)
    )
    assert not check_run([rises], flat).passed
    assert check_run([rises], rising).passed

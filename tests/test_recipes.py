"""Recipes: definition checks, `--recipe` precedence, lookup errors, listing, a pack that runs."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from areno_core.errors import ConfigError
from areno_core.recipe import Gate, HardwareFloor, Recipe, resolve_resource
from areno_core.registry import get_registry
from areno_core.resolve import resolve_run
from areno_core.testing import areno_exit_code

REPO = Path(__file__).resolve().parent.parent

PACK_SOURCE = """
from areno_core import hookimpl
from areno_core.recipe import Gate, HardwareFloor, Recipe

PKG = "resource:testpack_recipes"

ARITH = Recipe(
    name="testpack/arith",
    summary="Arithmetic rows for tests",
    algorithms=("sft", "grpo", "dpo"),
    dataset=PKG + "/data/rows.jsonl",
    checkpoint="random:qwen3-tiny",
    reward=PKG + "/reward.py",
    defaults={
        "lr": 1e-3, "min_lr": 1e-4, "batch_size": 4, "mini_bs": 2, "max_steps": 2,
        "max_new_tokens": 16, "activation_checkpointing": False, "epochs": 1,
    },
    lora_defaults={"lr": 4e-3},
    algorithm_defaults={
        "sft": {"dataset_loader_fn": PKG + "/loader.py:sft_row", "max_new_tokens": 24},
        "dpo": {"dataset_loader_fn": PKG + "/loader.py:dpo_row", "dpo_beta": 0.2},
        "grpo": {
            "dataset_loader_fn": PKG + "/loader.py:rl_row", "n_samples": 2,
            "max_new_tokens": 8, "gradient_accumulation_steps": 1,
        },
    },
    expected_metrics={"train/loss": "training loss"},
    gates=(Gate("finite", "train/loss"), Gate("checkpoint_loadable")),
)

BIG = Recipe(
    name="testpack/big",
    summary="A GPU recipe that needs LoRA",
    algorithms=("grpo", "gspo"),
    dataset=PKG + "/data/rows.jsonl",
    loader=PKG + "/loader.py:rl_row",
    reward=PKG + "/reward.py",
    checkpoint="random:qwen3-tiny",
    hardware=HardwareFloor(device="cuda", min_gpus=1, min_gpu_memory_gb=80),
    lora_required=True,
)

HIDDEN = Recipe(
    name="testpack/hidden",
    summary="Internal release check",
    algorithms=("sft",),
    dataset=PKG + "/data/rows.jsonl",
    loader=PKG + "/loader.py:sft_row",
    checkpoint="random:qwen3-tiny",
    visibility="internal",
)


@hookimpl
def register_recipes(register):
    for recipe in (ARITH, BIG, HIDDEN):
        register(recipe)
"""

PACK_FILES = {
    "data/rows.jsonl": "".join(
        json.dumps({"q": f"What is {a} + {a + 1}?", "a": str(2 * a + 1)}) + "\n" for a in range(12)
    ),
    "loader.py": """
def sft_row(row):
    return {"prompt": row["q"], "response": "It is " + row["a"] + "."}

def dpo_row(row):
    return {"prompt": row["q"], "chosen": "It is " + row["a"] + ".", "rejected": "No idea."}

def rl_row(row):
    return {"prompt": row["q"], "answer": row["a"]}
""",
    "reward.py": """
def reward_fn(record):
    return float(record.answer in record.completion)
""",
}


@pytest.fixture
def recipe_registry(install_areno_plugin, monkeypatch):
    """The real algorithms plus a test recipe pack installed as a temporary distribution."""
    monkeypatch.setenv("ARENO_PLUGINS", "algos,testpack_recipes")
    return install_areno_plugin(
        "testpack-recipes", "testpack_recipes", PACK_SOURCE, extra_files=PACK_FILES
    )


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = areno_exit_code(*argv)
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


def recipe(**overrides) -> Recipe:
    kwargs = {"name": "pack/demo", "summary": "demo", "algorithms": ("sft",), **overrides}
    return Recipe(**kwargs)


# -- precedence ----------------------------------------------------------------------------


def test_recipe_precedence_recipe_below_config_below_flags_flag_wins(recipe_registry, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  lr: 5.0e-4\n  mini_bs: 7\nrollout:\n  batch_size: 6\n")
    flags = {"recipe": "testpack/arith", "algo": "sft", "mini_bs": 3}
    cfg = resolve_run(flags, registry=recipe_registry, config_path=str(config)).config
    assert cfg.mini_bs == 3  # flag over --config over recipe
    assert cfg.lr == 5e-4 and cfg.batch_size == 6  # --config over recipe
    assert cfg.max_new_tokens == 24  # the recipe's sft value over its shared one
    assert cfg.min_lr == 1e-4 and cfg.max_steps == 2  # recipe over built-in defaults
    assert cfg.seed == 0 and cfg.grad_clip_norm == 1.0  # built-in defaults left alone
    assert cfg.dataset_loader_fn.endswith("testpack_recipes/loader.py:sft_row")
    assert Path(cfg.dataset_path).is_file()


def test_recipe_precedence_without_config_recipe_beats_defaults(recipe_registry):
    resolved = resolve_run({"recipe": "testpack/arith", "algo": "dpo"}, registry=recipe_registry)
    cfg = resolved.config
    assert (cfg.lr, cfg.max_new_tokens, cfg.mini_bs) == (1e-3, 16, 2)
    assert resolved.algorithm_config.dpo_beta == 0.2
    assert resolved.recipe is not None and resolved.recipe.name == "testpack/arith"
    assert "dpo_beta" in resolved.recipe_options and resolved.explicit == {"recipe", "algo"}


def test_recipe_dry_run_prints_recipe_values_overrides_and_valid_yaml(
    capsys, recipe_registry, tmp_path
):
    config = tmp_path / "run.yaml"
    config.write_text("lr: 5.0e-4\n")
    code, out, err = run_cli(
        capsys, "train", "--recipe", "testpack/arith", "--algo", "grpo",
        "--config", str(config), "--n-samples", "3", "--dry-run",
    )  # fmt: skip
    assert code == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["basic"]["recipe"] == "testpack/arith"
    assert resolved["rollout"]["n_samples"] == 3 and resolved["train"]["lr"] == 5e-4
    assert resolved["rollout"]["reward_fn_path"].endswith("testpack_recipes/reward.py")
    header = [line for line in out.splitlines() if line.startswith("#")]
    assert header[0].startswith("# recipe testpack/arith (public) with --algo grpo")
    overridden = next(h for h in header if "overridden" in h)
    assert "lr" in overridden and "n_samples" in overridden
    kept = next(h for h in header if h.startswith("# set by the recipe"))
    assert "reward_fn_path" in kept and "gradient_accumulation_steps" in kept
    assert "# gate: train/loss is finite" in header


# -- algorithm choice ---------------------------------------------------------------------


def test_recipe_unsupported_algo_error_lists_supported_ones(capsys, recipe_registry):
    code, _, err = run_cli(capsys, "train", "--recipe", "testpack/arith", "--algo", "ppo")
    assert code == 2
    assert "recipe 'testpack/arith' does not support --algo 'ppo'" in err
    assert "it supports: sft, grpo, dpo" in err


def test_recipe_packaged_file_needed_only_when_not_overridden(recipe_registry, tmp_path):
    packaged = Path(resolve_resource("resource:testpack_recipes/data/rows.jsonl"))
    own = tmp_path / "own.jsonl"
    own.write_text(packaged.read_text())
    packaged.unlink()  # a pack installed without its data
    flags = {"recipe": "testpack/arith", "algo": "sft", "dataset_path": str(own)}
    assert resolve_run(flags, registry=recipe_registry).config.dataset_path == str(own)
    with pytest.raises(ConfigError, match="no file 'data/rows.jsonl' inside package"):
        resolve_run({"recipe": "testpack/arith", "algo": "sft"}, registry=recipe_registry)


def test_recipe_several_algorithms_without_algo_asks_for_one(recipe_registry):
    with pytest.raises(ConfigError, match=r"supports several algorithms \(sft, grpo, dpo\)"):
        resolve_run({"recipe": "testpack/arith"}, registry=recipe_registry)


def test_recipe_default_algo_supported_is_used_without_algo(recipe_registry):
    cfg = resolve_run(
        {"recipe": "testpack/big"}, registry=recipe_registry, check_capabilities=False
    ).config
    assert cfg.algo == "gspo"  # the built-in default, which the recipe supports


def test_recipe_reward_left_out_for_offline_algorithm(recipe_registry):
    sft = resolve_run({"recipe": "testpack/arith", "algo": "sft"}, registry=recipe_registry)
    grpo = resolve_run({"recipe": "testpack/arith", "algo": "grpo"}, registry=recipe_registry)
    assert sft.config.reward_fn_path is None
    assert grpo.config.reward_fn_path.endswith("reward.py")


def test_recipe_explicit_reward_for_offline_algorithm_still_errors(recipe_registry):
    flags = {"recipe": "testpack/arith", "algo": "sft", "reward_fn_path": "r.py"}
    with pytest.raises(ConfigError, match="--reward-fn-path is for online RL"):
        resolve_run(flags, registry=recipe_registry)


def test_recipe_lora_required_without_lora_rank_fails_clearly_but_dry_run_resolves(
    capsys, recipe_registry
):
    with pytest.raises(ConfigError, match="needs LoRA adapters .* add --lora-rank"):
        resolve_run({"recipe": "testpack/big", "algo": "grpo"}, registry=recipe_registry)
    code, out, err = run_cli(capsys, "train", "--recipe", "testpack/big", "--dry-run")
    assert code == 0, err
    assert "# hardware floor: 1x GPU (80 GiB); LoRA: required" in out


def test_recipe_lora_required_runs_with_lora_rank(capsys, recipe_registry, tmp_path):
    pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")
    run = tmp_path / "big"
    code, out, err = run_cli(
        capsys, "train", "--recipe", "testpack/big", "--algo", "grpo", "--lora-rank", "2",
        "--max-steps", "1", "--batch-size", "2", "--n-samples", "2", "--max-new-tokens", "6",
        "--mini-bs", "4", "--no-activation-checkpointing", "--save-path", str(run),
    )  # fmt: skip
    assert code == 0, err
    assert "LoRA rank 2" in out
    assert (run / "step_1" / "adapter_model.safetensors").is_file()


def test_recipe_lora_defaults_apply_only_when_lora_is_on(recipe_registry):
    plain = resolve_run({"recipe": "testpack/arith", "algo": "sft"}, registry=recipe_registry)
    assert plain.config.lr == 1e-3
    lora = {"recipe": "testpack/arith", "algo": "sft", "lora_rank": 4}
    assert resolve_run(lora, registry=recipe_registry).config.lr == 4e-3
    flag = resolve_run({**lora, "lr": 5e-4}, registry=recipe_registry).config
    assert flag.lr == 5e-4  # an explicit flag still wins


def test_recipe_lora_defaults_may_not_set_lora_rank():
    with pytest.raises(ValueError, match="lora_defaults may not set lora_rank"):
        recipe(lora_defaults={"lora_rank": 8})
    with pytest.raises(ValueError, match="with LoRA: --lr must be positive"):
        recipe(lora_defaults={"lr": -1.0})


# -- unknown names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("testpack/arithh", "testpack/arith"),
        ("arith", "testpack/arith"),
        ("testpack/bgi", "testpack/big"),
        ("mathpack/arith", "testpack/arith"),
        ("testpack/zzz", None),
    ],
)
def test_recipe_unknown_name_suggests_close_public_names(capsys, recipe_registry, name, suggested):
    code, _, err = run_cli(capsys, "train", "--recipe", name, "--dry-run")
    assert code == 2
    assert f"unknown recipe {name!r}" in err
    if suggested:
        assert f"Did you mean '{suggested}'?" in err
    else:
        assert "Did you mean" not in err
    assert "Public recipes: testpack/arith, testpack/big" in err
    assert "hidden" not in err


def test_recipe_internal_name_suggested_only_inside_its_pack(recipe_registry):
    with pytest.raises(ConfigError) as outside:
        resolve_run({"recipe": "hidden"}, registry=recipe_registry)
    assert "testpack/hidden" not in str(outside.value)
    with pytest.raises(ConfigError, match="Did you mean 'testpack/hidden'"):
        resolve_run({"recipe": "testpack/hiden"}, registry=recipe_registry)


def test_recipe_internal_runs_by_exact_name_with_warning(recipe_registry, caplog):
    resolved = resolve_run({"recipe": "testpack/hidden"}, registry=recipe_registry)
    assert resolved.config.algo == "sft"
    assert "internal" in caplog.text and "not a public API" in caplog.text


# -- listing ------------------------------------------------------------------------------


def test_recipe_listing_hides_internal_unless_included(capsys, recipe_registry):
    code, out, _ = run_cli(capsys, "train", "--list-recipes")
    assert code == 0
    assert "testpack/arith" in out and "testpack/big" in out
    assert "testpack/hidden" not in out
    assert "1x GPU (80 GiB)" in out and "CPU" in out
    code, out, _ = run_cli(capsys, "train", "--list-recipes", "--include-internal")
    assert code == 0 and "testpack/hidden (internal)" in out


def test_recipe_listing_filtered_by_algo_shows_only_supporting(capsys, recipe_registry):
    code, out, _ = run_cli(capsys, "train", "--list-recipes", "--algo", "gspo")
    assert code == 0
    assert "testpack/big" in out and "testpack/arith" not in out


def test_recipe_include_internal_without_list_is_usage_error(capsys, recipe_registry):
    code, _, err = run_cli(capsys, "train", "--include-internal", "--dry-run")
    assert code == 2 and "--include-internal only applies to --list-recipes" in err


def test_recipe_registry_listing_api_hides_internal(recipe_registry):
    public = [r.name for r in recipe_registry.recipes()]
    everything = [r.name for r in recipe_registry.recipes(include_internal=True)]
    assert public == ["testpack/arith", "testpack/big"]
    assert everything == ["testpack/arith", "testpack/big", "testpack/hidden"]


# -- definitions and resource references -------------------------------------------------


def test_recipe_resource_reference_resolves_inside_installed_package(recipe_registry):
    path = resolve_resource("resource:testpack_recipes/data/rows.jsonl")
    assert Path(path).is_file() and Path(path).parent.parent.name == "testpack_recipes"
    spec = resolve_resource("resource:testpack_recipes/loader.py:rl_row")
    file_part, _, function = spec.rpartition(":")
    assert function == "rl_row" and Path(file_part).is_file()
    assert resolve_resource("random:qwen3-tiny") == "random:qwen3-tiny"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("resource:no_such_pkg_xyz/a.jsonl", "package 'no_such_pkg_xyz' is not installed"),
        ("resource:areno_core/no/such.jsonl", "no file 'no/such.jsonl' inside package"),
        ("resource:areno_core/../etc/passwd", "without '..'"),
        ("resource:/etc/passwd", "importable package name"),
        ("resource:areno_core/x.py:not-a-name", "is not a Python function name"),
    ],
)
def test_recipe_bad_resource_reference_is_config_error(value, message):
    with pytest.raises(ConfigError, match=message):
        resolve_resource(value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"dataset": "/data/rows.jsonl"},
        {"checkpoint": "~/models/qwen"},
        {"loader": "C:\\packs\\loader.py"},
        {"defaults": {"reward_fn_path": "/home/me/reward.py"}},
        {"algorithm_defaults": {"sft": {"dataset_path": "/tmp/x.jsonl"}}},
    ],
)
def test_recipe_absolute_path_is_rejected_at_definition(overrides):
    with pytest.raises(ValueError, match="is an absolute path; reference package files as"):
        recipe(**overrides)


def test_recipe_resource_escaping_package_is_rejected_at_definition():
    with pytest.raises(ValueError, match="without '..'"):
        recipe(dataset="resource:areno_core/../../secrets.jsonl")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"defaults": {"algo": "sft"}}, "may not set 'algo'"),
        ({"defaults": {"lr": -1.0}}, "--lr must be positive"),
        ({"algorithm_defaults": {"dpo": {"dpo_beta": 0.1}}}, "does not list in algorithms"),
        ({"name": "no-pack"}, "must look like 'pack/name'"),
        ({"algorithms": "sft"}, "tuple of names"),
        ({"algorithms": ("sft", "sft")}, "lists an algorithm twice"),
        ({"gates": ("finite",)}, "gates must be Gate objects"),
    ],
)
def test_recipe_invalid_definition_is_rejected_with_reason(overrides, message):
    with pytest.raises((ValueError, TypeError), match=message):
        recipe(**overrides)


BAD_RECIPES_SOURCE = """
from areno_core import hookimpl
from areno_core.recipe import Recipe


@hookimpl
def register_recipes(register):
    register(Recipe("bad/typo", "typo", ("sft",), defaults={"learning_rate": 1e-5}))
    register(Recipe("bad/value", "bad value", ("dpo",), defaults={"dpo_beta": -1.0}))
    foreign = {"gspo": {"dpo_beta": 1.0}}
    register(Recipe("bad/foreign", "other algo", ("gspo",), algorithm_defaults=foreign))
    register(Recipe("bad/fine", "fine", ("dpo",), defaults={"dpo_beta": 0.3}))
"""


def test_recipe_with_bad_plugin_options_is_dropped_and_reported(install_areno_plugin, monkeypatch):
    monkeypatch.setenv("ARENO_PLUGINS", "algos,bad_recipes")
    registry = install_areno_plugin("bad-recipes", "bad_recipes", BAD_RECIPES_SOURCE)
    assert registry.names("recipes") == ["bad/fine"]
    errors = sorted(f.error for f in registry.failures if f.distribution == "bad-recipes")
    assert len(errors) == 3
    assert "recipe 'bad/foreign' is not usable" in errors[0]
    assert "sets --dpo-beta, which --algo gspo does not read" in errors[0]
    assert "algorithm dpo (areno-algos)" in errors[0]
    assert "recipe 'bad/typo' is not usable" in errors[1]
    assert "unknown option 'learning_rate'" in errors[1]
    assert "recipe 'bad/value' is not usable" in errors[2]
    assert "--dpo-beta must be > 0, got -1.0" in errors[2]


def test_recipe_existing_constructor_arguments_still_work():
    made = Recipe(
        "math/demo",
        "demo",
        ("grpo", "gspo"),
        {"dataset_loader_fn": "gsm8k", "reward_fn_path": "math_verify"},
        {"grpo": {"n_samples": 4}},
        HardwareFloor(device="cuda", min_gpus=1),
        "openai/gsm8k:main",
        "Qwen/Qwen3-0.6B",
        False,
        {"rollout/reward_mean": "accuracy"},
        (Gate("at_least", "rollout/reward_mean", threshold=0.1),),
        "public",
    )
    options = made.options_for("grpo")
    assert options["dataset_path"] == "openai/gsm8k:main" and options["n_samples"] == 4
    assert made.pack == "math" and not made.internal
    assert "reward_fn_path" not in made.options_for("gspo", rollout=False)


def test_recipe_pack_with_invalid_recipe_fails_alone(install_areno_plugin, monkeypatch):
    monkeypatch.setenv("ARENO_PLUGINS", "algos,testpack_recipes,broken_recipes")
    install_areno_plugin(
        "testpack-recipes", "testpack_recipes", PACK_SOURCE, extra_files=PACK_FILES
    )
    broken = """
from areno_core import hookimpl
from areno_core.recipe import Recipe

BAD = Recipe(name="broken/x", summary="x", algorithms=("sft",), defaults={"learning_rate": 1})

@hookimpl
def register_recipes(register):
    register(BAD)
"""
    registry = install_areno_plugin("broken-recipes", "broken_recipes", broken)
    assert [r.name for r in registry.recipes()] == ["testpack/arith", "testpack/big"]
    (failure,) = registry.failures
    assert failure.distribution == "broken-recipes"
    assert "unknown option 'learning_rate'" in failure.error


# -- a pack installed from a temporary distribution ------------------------------------------


@pytest.mark.parametrize("algo", ["sft", "grpo"])
def test_recipe_pack_from_temporary_distribution_lists_and_trains(
    capsys, recipe_registry, tmp_path, algo
):
    from areno_core.gates import check_run

    code, out, _ = run_cli(capsys, "train", "--list-recipes", "--algo", algo)
    assert code == 0 and "testpack/arith" in out
    run = tmp_path / algo
    code, out, err = run_cli(
        capsys, "train", "--recipe", "testpack/arith", "--algo", algo, "--save-path", str(run)
    )
    assert code == 0, err
    rows = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["basic"]["recipe"] == "testpack/arith" and saved["basic"]["algo"] == algo
    report = check_run(get_registry().recipe("testpack/arith"), run)
    assert report.passed, [r.reason for r in report.failures]


# -- keeping internal recipes out of the public surface ------------------------------------


def test_docs_and_examples_never_point_users_at_internal_recipes():
    offenders = []
    for root in ("docs", "examples"):
        for path in (REPO / root).rglob("*"):
            if not path.is_file() or path.suffix not in (".md", ".py", ".yaml", ".yml", ".sh"):
                continue
            if path.name == "recipe-system.md":
                continue  # the design doc explains the smoke pack
            if "--recipe smoke/" in path.read_text(errors="replace"):
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"public docs/examples use internal smoke recipes: {offenders}"


def test_installed_smoke_pack_recipes_are_internal_and_never_published(monkeypatch):
    from areno_core.plugins import get_plugin_manager
    from areno_core.registry import Registry, set_registry

    monkeypatch.delenv("ARENO_PLUGINS", raising=False)
    set_registry(None)
    registry = Registry(get_plugin_manager())
    for name, entry in registry.entries["recipes"].items():
        if entry.obj.pack != "smoke":
            continue
        assert entry.obj.internal, f"smoke recipe {name} must be visibility='internal'"
        classifiers = metadata.metadata(entry.plugin.distribution).get_all("Classifier") or []
        assert "Private :: Do Not Upload" in classifiers, (
            f"smoke recipe {name} comes from {entry.plugin.distribution}, which could be "
            "published: mark it 'Private :: Do Not Upload'"
        )


@pytest.mark.parametrize("algo", [["--algo", "gspo"], []])
def test_recipe_without_the_algorithms_plugin_says_to_install_it(capsys, monkeypatch, algo):
    pytest.importorskip(
        "areno_recipes_math", reason="needs the math recipe pack (installed by scripts/dev.sh)"
    )
    from areno_core.registry import set_registry

    monkeypatch.setenv("ARENO_PLUGINS", "math")  # the recipe pack, its algorithms disabled
    set_registry(None)
    try:
        code, _, err = run_cli(capsys, "train", *algo, "--recipe", "math/arith", "--dry-run")
    finally:
        set_registry(None)
    assert code == 2
    assert err == (
        "Error: unknown algorithm 'gspo'. No algorithms are registered. Install them with: pip "
        "install areno-algos"
    )

"""Tests of the example plugin pack, with the fixtures areno-core ships for plugin authors.

``install_areno_plugin`` (from ``areno_core.testing``, loaded by pytest through the ``pytest11``
entry point of areno-core) writes a real distribution with an ``areno`` entry point into a
temporary directory on ``sys.path`` and returns a registry built the way ``areno`` builds it.
The package is installed from this checkout's files and its own ``pyproject.toml``, so the
tests also pass before ``pip install`` and check the entry point that ``pip`` would install.

    pytest examples/plugin-pack/tests
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from areno_core.errors import ConfigError, DatasetError
from areno_core.registry import Registry
from areno_core.resolve import resolve_run
from areno_core.types import RewardRecord

PACK = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((PACK / "pyproject.toml").read_text())["project"]
[(ENTRY_POINT, MODULE)] = PROJECT["entry-points"]["areno"].items()


@pytest.fixture
def pack_registry(
    install_areno_plugin: Callable[..., Registry], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Registry]:
    """A registry with this pack and the algorithms it trains with, nothing else."""
    monkeypatch.setenv("ARENO_PLUGINS", f"{PROJECT['name']},areno-algos")
    package = PACK / MODULE
    files = {
        str(path.relative_to(package)): path.read_text()
        for path in sorted(package.rglob("*"))
        if path.is_file() and path.name != "__init__.py" and "__pycache__" not in path.parts
    }
    yield install_areno_plugin(
        PROJECT["name"],
        MODULE,
        (package / "__init__.py").read_text(),
        PROJECT["version"],
        entry_point_name=ENTRY_POINT,
        extra_files=files,
    )
    for name in [m for m in sys.modules if m.startswith(MODULE + ".")]:
        del sys.modules[name]


def test_pyproject_entry_point_names_top_level_module():
    assert ENTRY_POINT == "mypack"
    assert MODULE == "areno_mypack"
    assert (PACK / MODULE / "__init__.py").is_file()


def test_installed_pack_registers_loader_reward_and_recipe(pack_registry):
    [info] = [p for p in pack_registry.plugins() if p.distribution == "areno-mypack"]
    assert (info.name, info.version) == ("mypack", "0.1.0")
    assert pack_registry.failures == []
    assert pack_registry.provided_by("mypack") == {
        "dataset_loaders": ["mypack_echo"],
        "rewards": ["mypack_echo"],
        "recipes": ["mypack/echo"],
    }


def test_echo_reward_partial_prefix_scores_matched_fraction(pack_registry):
    reward_fn = pack_registry.get("rewards", "mypack_echo")

    def score(completion: str) -> float:
        return reward_fn(
            RewardRecord(prompt="Repeat exactly: red fox", completion=completion, answer="red fox")
        )

    assert score("red fox and more") == 1.0
    assert score("red fx") == pytest.approx(0.5 * 6 / 7 + 0.5 * 5 / 7)
    assert score("blue") == pytest.approx(0.5 * 1 / 7)  # only "e" is shared
    assert score("") == 0.0


def test_echo_loader_row_without_text_raises_dataset_error(pack_registry):
    loader = pack_registry.get("dataset_loaders", "mypack_echo")
    assert loader({"text": "owl sun"}) == {"prompt": "Repeat exactly: owl sun", "answer": "owl sun"}
    with pytest.raises(DatasetError, match="'text'"):
        loader({"question": "?"})


def test_echo_recipe_public_listing_shows_cpu_floor(pack_registry):
    [recipe] = [r for r in pack_registry.recipes() if r.pack == "mypack"]
    assert recipe.name == "mypack/echo"
    assert recipe.visibility == "public"
    assert recipe.algorithms == ("grpo", "rloo")
    assert recipe.hardware.describe() == "CPU, 2 GiB RAM"


def test_echo_recipe_resolves_defaults_explicit_flag_wins(pack_registry):
    resolved = resolve_run(
        {"recipe": "mypack/echo", "algo": "rloo", "lr": 5e-4}, registry=pack_registry
    )
    cfg = resolved.config
    assert Path(cfg.dataset_path).is_file()
    assert Path(cfg.dataset_path).name == "echo.jsonl"
    assert (cfg.ckpt, cfg.reward_fn_path, cfg.dataset_loader_fn) == (
        "random:qwen3-tiny",
        "mypack_echo",
        "mypack_echo",
    )
    assert (cfg.n_samples, resolved.algorithm_config.clip_eps) == (4, 0.2)
    assert cfg.lr == 5e-4  # the explicit option, not the recipe's 1e-3


def test_echo_recipe_without_algo_raises_config_error(pack_registry):
    with pytest.raises(ConfigError, match="choose one with --algo"):
        resolve_run({"recipe": "mypack/echo"}, registry=pack_registry)


def test_echo_recipe_trains_two_steps_logs_rewards(pack_registry, tmp_path):
    from areno_core.metrics.logger import read_jsonl
    from areno_core.run import run_training

    resolved = resolve_run(
        {
            "recipe": "mypack/echo",
            "algo": "grpo",
            "max_steps": 2,
            "save_path": str(tmp_path / "run"),
        },
        registry=pack_registry,
    )
    result = run_training(resolved, registry=pack_registry)
    assert result.steps == 2
    rows = read_jsonl(tmp_path / "run" / "tensorboard")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert 0.0 <= row["rollout/reward_mean"] <= 1.0
        assert row["rollout/samples"] == 16.0
        assert row["train/optimizer_steps"] == 2.0
    assert (tmp_path / "run" / "latest").read_text().strip() == "step_2"

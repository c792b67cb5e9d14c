"""The shipped task list matches the installed reasoning-gym; unknown tasks are named."""

from __future__ import annotations

import pytest
from areno_envs.rg import tasks

from areno_core.errors import ConfigError


def test_shipped_task_list_is_the_tested_versions_registry() -> None:
    from reasoning_gym.factory import DATASETS

    assert tasks.installed_version() == tasks.TESTED_VERSION
    assert tuple(sorted(DATASETS)) == tasks.TESTED_TASKS
    assert tasks.task_names() == tasks.TESTED_TASKS
    assert len(tasks.TESTED_TASKS) == 106


def test_unknown_task_is_named_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"unknown reasoning-gym task 'chain_summ'.*'chain_sum'"):
        tasks.check_task("chain_summ")
    assert tasks.check_task("chain_sum") == "chain_sum"


def test_config_fields_are_the_tasks_dataclass_options_without_seed_and_size() -> None:
    fields = tasks.config_fields("chain_sum")
    assert fields == {
        "min_terms": 2, "max_terms": 6, "min_digits": 1, "max_digits": 4, "allow_negation": False,
    }  # fmt: skip


def test_missing_reasoning_gym_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(tasks, "installed_version", lambda: None)
    with pytest.raises(ConfigError, match=r"pip install 'areno-envs\[reasoning-gym\]'"):
        tasks.check_task("chain_sum")


def test_without_reasoning_gym_the_recipes_stay_and_a_run_says_how_to_install(
    monkeypatch,
) -> None:
    from areno_envs.rg.loader import task_loader

    from areno_core.data import apply_loader
    from areno_core.errors import DatasetError

    monkeypatch.setattr(tasks, "installed_version", lambda: None)
    tasks.task_names.cache_clear()
    try:
        assert tasks.task_names() == tasks.TESTED_TASKS
        with pytest.raises(DatasetError, match=r"reasoning-gym is not installed.*pip install"):
            apply_loader([{"size": 2}], task_loader("chain_sum"))
    finally:
        tasks.task_names.cache_clear()

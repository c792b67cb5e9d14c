"""Spec rows: every bad value is named with what was expected."""

from __future__ import annotations

import pytest
from areno_envs.rg.spec import parse_spec

from areno_core.errors import ConfigError


def test_defaults_and_fields() -> None:
    spec = parse_spec({"size": 10}, task="chain_sum")
    assert (spec.task, spec.seed, spec.size, spec.start, spec.stop) == ("chain_sum", 0, 10, 0, 10)
    assert spec.format == "chat" and spec.config == {} and spec.exclude == ()
    spec = parse_spec(
        {"task": "gcd", "seed": 3, "size": 10, "range": [4, 6], "exclude": [[0, 4]],
         "config": {"min_numbers": 2}, "format": "text"}
    )  # fmt: skip
    assert (spec.task, spec.seed, spec.start, spec.stop, spec.exclude) == (
        "gcd",
        3,
        4,
        6,
        ((0, 4),),
    )
    assert spec.config == {"min_numbers": 2} and spec.format == "text"


@pytest.mark.parametrize(
    ("row", "task", "message"),
    [
        ({"size": 5, "sead": 1}, "gcd", r"unknown key 'sead'. Did you mean 'seed'"),
        ({"size": 5}, None, r"has no 'task'"),
        ({"task": "lcm", "size": 5}, "gcd", r"names task 'lcm', but the loader is rg/gcd"),
        ({"task": "gdc", "size": 5}, None, r"unknown reasoning-gym task 'gdc'"),
        ({"size": 0}, "gcd", r"'size' must be an integer >= 1, got 0"),
        ({"size": "5"}, "gcd", r"'size' must be an integer >= 1, got '5'"),
        ({"size": 5, "range": [3, 9]}, "gcd", r"'range' must be .*size \(5\), got \[3, 9\]"),
        ({"size": 5, "exclude": [0, 2]}, "gcd", r"each 'exclude' range must be"),
        ({"size": 5, "format": "json"}, "gcd", r"'format' must be one of chat, text, got 'json'"),
        ({"size": 5, "config": {"max_term": 3}}, "chain_sum",
         r"task 'chain_sum' has no option 'max_term'. Did you mean 'max_terms'.*min_terms=2"),
        ({"size": 5, "config": {"seed": 3}}, "chain_sum", r"no option 'seed' \(set it as the spec"),
        ({"size": 5, "config": [1]}, "chain_sum", r"'config' must be an object"),
    ],
)  # fmt: skip
def test_bad_rows_name_the_value(row: dict, task: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_spec(row, task=task)


def test_env_args_lay_over_the_rows_config() -> None:
    from areno_envs.rg.loader import task_loader

    load = task_loader("chain_sum")
    row = {"size": 4, "config": {"min_terms": 2, "max_terms": 2}}
    (first, *_) = load(row, env_args={"min_digits": 2, "max_digits": 2})
    assert first["rg"]["config"] == {
        "min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
    }  # fmt: skip
    assert load(row)[0]["rg"]["config"] == {"min_terms": 2, "max_terms": 2}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_terms": "3"}, "option 'max_terms' expects an integer (its default is 6), got '3'"),
        ({"allow_negation": 1}, "option 'allow_negation' expects true or false"),
        ({"max_term": 3}, "has no option 'max_term'. Did you mean 'max_terms'"),
    ],
)
def test_env_args_are_checked_by_name_and_type(config: dict, message: str) -> None:
    from areno_envs.rg.loader import task_loader

    with pytest.raises(ConfigError) as exc:
        task_loader("chain_sum")({"size": 4}, env_args=config)
    assert message in str(exc.value)

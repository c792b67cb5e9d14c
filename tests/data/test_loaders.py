"""Tests for areno_core.data.loaders: resolving and applying dataset loaders."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from areno_core.data.loaders import apply_loader, check_loader, parse_env_args, resolve_loader
from areno_core.data.schema import RL_SCHEMA, validate_rows
from areno_core.data.sources import load_rows
from areno_core.errors import ConfigError, DatasetError, PluginError, UserCodeError

GSM8K_LOADER = '''
def load_row(row):
    """Map a raw GSM8K row to an RL row: the question, and the number after '####'."""
    return {"prompt": row["question"], "answer": row["answer"].split("####")[-1].strip()}


def drop_long(row):
    return None if len(row["question"]) > 200 else load_row(row)
'''


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def gsm8k_rows(gsm8k_dir: Path) -> list[dict[str, Any]]:
    """The first 50 real GSM8K training rows."""
    with (gsm8k_dir / "train.jsonl").open(encoding="utf-8") as handle:
        return [json.loads(line) for _, line in zip(range(50), handle, strict=False)]


@pytest.fixture
def loader_file(tmp_path: Path) -> Path:
    path = tmp_path / "gsm8k_loader.py"
    path.write_text(GSM8K_LOADER, encoding="utf-8")
    return path


def _no_registry(name: str) -> Callable[..., Any]:
    raise AssertionError(f"registry must not be consulted for {name!r}")


# --- resolve_loader ----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [None, "", "   "])
def test_resolve_loader_unset_returns_none(spec: str | None) -> None:
    assert resolve_loader(spec, _no_registry) is None


def test_resolve_loader_file_uses_load_row_by_default(loader_file: Path) -> None:
    loader = resolve_loader(str(loader_file), _no_registry)
    assert loader is not None
    assert loader.__name__ == "load_row"
    assert loader({"question": "q?", "answer": "work\n#### 7"}) == {"prompt": "q?", "answer": "7"}


def test_resolve_loader_file_with_function_uses_that_function(loader_file: Path) -> None:
    loader = resolve_loader(f"{loader_file}:drop_long", _no_registry)
    assert loader is not None
    assert loader({"question": "x" * 300, "answer": "#### 1"}) is None


def test_resolve_loader_missing_file_raises_user_code_error(tmp_path: Path) -> None:
    with pytest.raises(UserCodeError, match=r"^dataset loader file not found: .*absent\.py"):
        resolve_loader(str(tmp_path / "absent.py"), _no_registry)


def test_resolve_loader_name_goes_through_registry() -> None:
    def gsm8k_loader(row: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": row["question"]}

    seen: list[str] = []

    def lookup(name: str) -> Callable[..., Any]:
        seen.append(name)
        return gsm8k_loader

    assert resolve_loader("math/gsm8k", lookup) is gsm8k_loader
    assert seen == ["math/gsm8k"]


def _no_such_loader(name: str) -> Callable[..., Any]:
    raise KeyError(name)


def _registry_refuses(name: str) -> Callable[..., Any]:
    raise PluginError(f"no dataset loader {name!r}; registered: math/gsm8k")


@pytest.mark.parametrize(
    ("name", "lookup", "error", "message"),
    [
        pytest.param(
            "gsm8k",
            None,
            ConfigError,
            r"^dataset loader 'gsm8k' is not a \.py file and no dataset loader registry is",
            id="name-without-registry",
        ),
        pytest.param(
            "nope",
            _no_such_loader,
            ConfigError,
            r"^unknown dataset loader 'nope': no plugin registered one by that name",
            id="unknown-name-key-error-becomes-config-error",
        ),
        pytest.param(
            "nope",
            _registry_refuses,
            PluginError,
            r"registered: math/gsm8k",
            id="registry-own-error-passes-through",
        ),
        pytest.param(
            "weird",
            lambda name: 3,
            UserCodeError,
            r"^dataset loader 'weird' from the registry is of type int, not a function$",
            id="registry-non-callable-is-rejected",
        ),
    ],
)
def test_resolve_loader_name_the_registry_cannot_give_is_a_clear_error(
    name: str, lookup: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        resolve_loader(name, lookup)


def test_resolve_loader_async_function_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "async_loader.py"
    path.write_text("async def load_row(row):\n    return row\n", encoding="utf-8")
    with pytest.raises(
        UserCodeError, match=r"^dataset loader 'load_row' \(.*async_loader\.py\) is async"
    ):
        resolve_loader(str(path), _no_registry)


def test_check_loader_two_required_arguments_is_rejected() -> None:
    def load_pair(row: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
        return row

    with pytest.raises(
        UserCodeError,
        match=r"load_pair' \(.*test_loaders\.py\) has signature \(row: 'dict\[str, Any\]', "
        r"tokenizer: 'Any'\) -> 'dict\[str, Any\]', but it is called with one argument",
    ):
        check_loader(load_pair)


def test_check_loader_extra_optional_arguments_are_fine() -> None:
    def load_with_default(row: dict[str, Any], scale: int = 2) -> dict[str, Any]:
        return row

    check_loader(load_with_default)


# --- apply_loader ------------------------------------------------------------------------------


def test_apply_loader_gsm8k_rows_map_to_rl_rows(
    loader_file: Path, gsm8k_rows: list[dict[str, Any]]
) -> None:
    loader = resolve_loader(str(loader_file), _no_registry)
    assert loader is not None
    rows = apply_loader(gsm8k_rows, loader)
    assert len(rows) == 50
    assert rows[0] == {"prompt": gsm8k_rows[0]["question"], "answer": "72"}
    assert rows[1]["answer"] == "10"
    assert [r["prompt"] for r in rows] == [r["question"] for r in gsm8k_rows]
    validate_rows(rows, RL_SCHEMA, algo="grpo")


def test_apply_loader_file_end_to_end_from_jsonl(gsm8k_dir: Path, loader_file: Path) -> None:
    raw = load_rows(str(gsm8k_dir / "train.jsonl"))
    loader = resolve_loader(f"{loader_file}:drop_long", _no_registry)
    assert loader is not None
    rows = apply_loader(raw, loader)
    kept = [r for r in raw if len(r["question"]) <= 200]
    assert len(rows) == len(kept)
    assert 0 < len(rows) < len(raw)
    validate_rows(rows, RL_SCHEMA, algo="gspo")


def test_apply_loader_none_and_empty_list_drop_rows() -> None:
    def keep_even(row: dict[str, Any]) -> dict[str, Any] | list[Any] | None:
        if row["i"] % 2 == 0:
            return {"prompt": str(row["i"])}
        return None if row["i"] % 3 else []

    rows = apply_loader([{"i": i} for i in range(6)], keep_even)
    assert rows == [{"prompt": "0"}, {"prompt": "2"}, {"prompt": "4"}]


def test_apply_loader_list_result_expands_in_order() -> None:
    def two_each(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"prompt": f"{row['i']}a"}, {"prompt": f"{row['i']}b"}]

    rows = apply_loader([{"i": 0}, {"i": 1}], two_each)
    assert [r["prompt"] for r in rows] == ["0a", "0b", "1a", "1b"]


def test_apply_loader_raising_loader_names_row_and_exception() -> None:
    def picky(row: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": row["question"]}

    rows = [{"question": "a"}, {"question": "b"}, {"title": "no question here"}]
    with pytest.raises(
        DatasetError,
        match=r"^dataset loader '.*picky' \(.*test_loaders\.py\) failed on row 2: "
        r"KeyError: 'question'$",
    ) as info:
        apply_loader(rows, picky)
    assert isinstance(info.value.__cause__, KeyError)


def test_apply_loader_wrong_return_type_names_row_and_type() -> None:
    def to_text(row: dict[str, Any]) -> Any:
        return "text" if row["i"] == 1 else {"prompt": "ok"}

    with pytest.raises(
        DatasetError,
        match=r"returned str for row 1; a loader must return a dict, a list of dicts, or None "
        r"to drop the row$",
    ):
        apply_loader([{"i": 0}, {"i": 1}], to_text)


def test_apply_loader_list_with_non_dict_item_names_row_and_item() -> None:
    def mixed(row: dict[str, Any]) -> list[Any]:
        return [{"prompt": "ok"}, ("not", "a", "dict")]

    with pytest.raises(
        DatasetError,
        match=r"returned a list for row 0 whose item 1 is tuple; every item must be a dict$",
    ):
        apply_loader([{"i": 0}], mixed)


def test_apply_loader_dropping_every_row_is_an_error() -> None:
    with pytest.raises(DatasetError, match=r"dropped all 3 rows; the dataset would be empty$"):
        apply_loader([{"i": 0}, {"i": 1}, {"i": 2}], lambda row: None)


def test_apply_loader_does_not_mutate_input_rows() -> None:
    raw = [{"question": "q", "answer": "a"}]

    def rename(row: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": row["question"], "answer": row["answer"]}

    out = apply_loader(raw, rename)
    out[0]["prompt"] = "changed"
    assert raw == [{"question": "q", "answer": "a"}]


def test_env_args_go_to_a_loader_that_takes_them_with_every_row() -> None:
    def load_row(row: dict, *, env_args: dict | None = None) -> dict:
        return {"prompt": row["q"], "options": env_args}

    rows = apply_loader([{"q": "a"}, {"q": "b"}], load_row, env_args={"level": 2})
    assert rows == [
        {"prompt": "a", "options": {"level": 2}},
        {"prompt": "b", "options": {"level": 2}},
    ]
    assert apply_loader([{"q": "a"}], load_row) == [{"prompt": "a", "options": None}]


def test_env_args_with_a_loader_that_takes_none_is_an_error_naming_them() -> None:
    def load_row(row: dict) -> dict:
        return row

    with pytest.raises(
        ConfigError, match=r'--env-args \{"level": 2\}: the dataset loader .* takes no'
    ):
        apply_loader([{"q": "a"}], load_row, env_args={"level": 2})


@pytest.mark.parametrize(
    ("text", "expected"), [(None, None), ('{"a": 1, "b": [2]}', {"a": 1, "b": [2]}), ("{}", {})]
)
def test_parse_env_args(text: str | None, expected: dict | None) -> None:
    assert parse_env_args(text) == expected


@pytest.mark.parametrize("text", ["[1, 2]", "level=2", '"x"'])
def test_parse_env_args_names_a_value_that_is_not_a_json_object(text: str) -> None:
    with pytest.raises(ConfigError, match="--env-args expects a JSON object, got"):
        parse_env_args(text)

"""The ``vf`` loader, reward and tools on the test tasksets of ``vf_envs/``, and their errors."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from areno_envs.vf.library import taskset_class, taskset_config
from areno_envs.vf.loader import vf_loader
from areno_envs.vf.reward import task_of, vf_reward_fn
from areno_envs.vf.spec import parse_spec
from areno_envs.vf.tools import open_tools

from areno_core.cli.main import main
from areno_core.errors import ConfigError
from areno_core.plugins import get_plugin_manager
from areno_core.registry import Registry
from areno_core.types import RewardRecord

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _vf_envs_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE / "vf_envs"))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"taskset": "vf_sums", "rnage": [0, 2]}, "unknown key 'rnage'. Did you mean 'range'?"),
        ({"config": {}}, "'taskset' must name a taskset, got None"),
        ({"taskset": "vf_sums", "range": [3, 3]}, "'range' must be [start, stop]"),
        ({"taskset": "vf_sums", "max_turns": 0}, "'max_turns' must be an integer >= 1, got 0"),
        ({"taskset": "vf_sums", "config": [1]}, "'config' must be an object"),
    ],
)
def test_bad_spec_rows_are_named(row: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as exc:
        parse_spec(row)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"taskset": "vf_sums", "config": {"cout": 2}},
         "taskset 'vf_sums' has no option 'cout'. Did you mean 'count'? Its options: count=8, "
         "largest=9"),
        ({"taskset": "vf_sums", "config": {"count": "two"}},
         "taskset 'vf_sums': bad option value (count='two': Input should be a valid integer"),
        ({"taskset": "vf_no_such_env"}, "taskset 'vf_no_such_env' could not be loaded"),
    ],
)  # fmt: skip
def test_bad_taskset_or_option_is_named(row: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        vf_loader(row)
    assert message in str(exc.value)


def test_loader_rows_are_the_tasks_prompts_with_their_wire_data() -> None:
    rows = vf_loader({"taskset": "vf_sums", "config": {"count": 3}, "range": [1, 3]})
    system = {"role": "system", "content": "Answer with the number."}
    assert [r["prompt"] for r in rows] == [
        [system, {"role": "user", "content": "1 + 4 ="}],
        [system, {"role": "user", "content": "2 + 7 ="}],
    ]
    meta = rows[0]["vf"]
    assert meta["taskset"] == "vf_sums" and meta["config"] == {"count": 3} and meta["idx"] == 1
    assert meta["data"]["a"] == 1 and meta["data"]["b"] == 4
    assert (meta["max_turns"], meta["tool_choice"]) == (8, "auto")
    task = task_of(rows[0])
    assert type(task).__name__ == "SumTask" and (task.data.a, task.data.b) == (1, 4)


@pytest.mark.parametrize(
    ("reply", "reward"), [("5", 1.5), ("it is 5, I think", 1.0), ("6", 0.5), ("no idea at all", 0)]
)
def test_reward_is_the_weighted_sum_of_the_task_rewards(reply: str, reward: float) -> None:
    (row,) = vf_loader({"taskset": "vf_sums", "range": [1, 2]})  # 1 + 4
    record = RewardRecord(
        prompt="", completion=reply, row=row,
        messages=[*row["prompt"], {"role": "assistant", "content": reply}],
    )  # fmt: skip
    assert asyncio.run(vf_reward_fn(record)) == reward


def test_reward_of_a_row_from_another_loader_is_an_error() -> None:
    record = RewardRecord(prompt="2 + 2 =", completion="4", row={"prompt": "2 + 2 ="})
    with pytest.raises(ValueError, match="rows made by the 'vf' loader"):
        asyncio.run(vf_reward_fn(record))


def test_tools_are_the_toolsets_mcp_tools_called_in_process() -> None:
    (row,) = vf_loader({"taskset": "vf_tictactoe", "range": [0, 1]})

    async def run() -> tuple[Any, list[Any]]:
        box = await open_tools(
            task_of(row), taskset_class("vf_tictactoe"), taskset_config("vf_tictactoe", {})
        )
        results = [
            await box.call("choose_square", '{"square": 6}'),
            await box.call("choose_square", '{"square": 6'),
            await box.call("choose_square", "[6]"),
            await box.call("place", "{}"),
        ]
        return box.schemas, results

    schemas, results = asyncio.run(run())
    (tool,) = schemas
    assert tool["function"]["name"] == "choose_square"
    assert tool["function"]["description"] == "Place your mark on a free square (1 to 9)."
    assert tool["function"]["parameters"]["properties"]["square"]["type"] == "integer"
    assert results[0] == "You marked square 6."
    assert results[1].startswith("error: invalid JSON in tool arguments")
    assert results[2] == "error: tool arguments must be a JSON object, got list"
    assert results[3] == "error: unknown tool 'place'"


def test_registration_does_not_import_verifiers(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verifiers", None)
    registry = Registry(get_plugin_manager())
    assert not [f for f in registry.failures if "envs" in f.name]
    assert registry.get("dataset_loaders", "vf") and registry.get("rewards", "vf")
    assert registry.get("agents", "vf")
    with pytest.raises(ConfigError, match=r"pip install 'areno-envs\[verifiers\]'"):
        vf_loader({"taskset": "vf_sums"})


def test_bad_option_fails_before_the_model_loads(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "spec.jsonl"
    spec.write_text('{"taskset": "vf_sums", "config": {"largets": 3}}\n')
    save = tmp_path / "run"
    # a hub checkpoint: an error after the rows load would name the hub instead
    with pytest.raises(SystemExit) as exc:
        main(["train", "--algo", "grpo", "--ckpt", "Qwen/Qwen3-0.6B", "--dataset-path",
              str(spec), "--dataset-loader-fn", "vf", "--reward-fn-path", "vf",
              "--save-path", str(save)])  # fmt: skip
    assert exc.value.code not in (0, None)
    err = " ".join(capsys.readouterr().err.split())
    assert "has no option 'largets'. Did you mean 'largest'?" in err
    assert not save.exists()


def test_agent_names_a_tool_choice_the_task_does_not_have() -> None:
    from areno_envs.vf.agent import play

    (row,) = vf_loader({"taskset": "vf_tictactoe", "range": [0, 1], "tool_choice": "chose_square"})
    item = SimpleNamespace(row=row, messages=tuple(row["prompt"]))
    ctx = SimpleNamespace(get_base_url=lambda item: "http://127.0.0.1:9", api_key="k", model="m")
    with pytest.raises(ValueError, match="tool_choice 'chose_square' is not .* choose_square"):
        asyncio.run(play(ctx, item))


def test_env_args_lay_over_the_rows_taskset_options_and_are_checked() -> None:
    rows = vf_loader({"taskset": "vf_sums", "config": {"count": 5}}, env_args={"count": 2})
    assert len(rows) == 2 and rows[0]["vf"]["config"] == {"count": 2}
    with pytest.raises(ConfigError, match="bad option value \\(largest='nine'"):
        vf_loader({"taskset": "vf_sums"}, env_args={"largest": "nine"})

"""``areno eval``: settings by layer, checkpoint references, clear errors before loading, and
end-to-end reports on a tiny random model (the math pack's tests reproduce training's
eval/accuracy with it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areno_core.checkpoint_eval import CheckpointRef, eval_settings, find_checkpoints
from areno_core.cli.main import main
from areno_core.errors import ConfigError
from areno_core.testing import run_areno

ROWS = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in ((1, 2), (3, 4), (5, 6))]

EVAL_PACK = """
from areno_core import hookimpl
from areno_core.evaluators import EvaluatorSpec
from areno_core.recipe import Recipe

DATA = {data!r}


def loader(row):
    return {{"prompt": row["question"], "answer": row["answer"]}}


@hookimpl
def register_dataset_loaders(register):
    register("toy_question", loader)


@hookimpl
def register_rewards(register):
    register("always_half", lambda record: 0.5)


@hookimpl
def register_recipes(register):
    register(Recipe(name="toyeval/task", summary="a toy task", algorithms=("grpo",),
                    loader="toy_question", reward="always_half",
                    defaults={{"max_new_tokens": 3, "max_prompt_tokens": 64}}))


@hookimpl
def register_evaluators(register):
    register(EvaluatorSpec("toyeval/task", "half a point is right here", dataset=DATA,
                           max_new_tokens=2, correct_at=0.5,
                           extra_metrics=lambda groups: {{"prompts_seen": float(len(groups))}}))
"""


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.fixture
def eval_pack(install_areno_plugin, monkeypatch, data):
    monkeypatch.setenv("ARENO_PLUGINS", "eval_pack")
    return install_areno_plugin("eval-pack", "eval_pack", EVAL_PACK.format(data=str(data)))


def test_settings_layers_recipe_then_evaluator_then_flags(eval_pack, data) -> None:
    settings, evaluator = eval_settings({"recipe": "toyeval/task"}, eval_pack)
    assert evaluator is not None and evaluator.name == "toyeval/task"
    assert settings.dataset == str(data)  # from the evaluator (the recipe sets no eval set)
    assert settings.loader == "toy_question" and settings.reward == "always_half"  # recipe
    assert settings.max_new_tokens == 2  # the evaluator's, over the recipe's 3
    assert settings.max_prompt_tokens == 64 and settings.correct_at == 0.5
    flagged, _ = eval_settings({"recipe": "toyeval/task", "max_new_tokens": 1}, eval_pack)
    assert flagged.max_new_tokens == 1


def test_eval_with_a_registered_evaluator_uses_its_threshold_and_metrics(
    eval_pack, tmp_path, capsys
) -> None:
    out = tmp_path / "report.json"
    run_areno("eval", "--recipe", "toyeval/task", "--ckpt", "random:qwen3-tiny",
              "--output", str(out))  # fmt: skip
    [result] = json.loads(out.read_text())["results"]
    assert result["checkpoint"] == "random:qwen3-tiny" and result["step"] is None
    metrics = result["metrics"]
    assert metrics["accuracy"] == 1.0  # every reward is 0.5, and 0.5 counts as right here
    assert metrics["reward_mean"] == 0.5 and metrics["prompts"] == 3.0
    assert metrics["prompts_seen"] == 3.0
    assert 1 <= metrics["response_length_mean"] <= 2  # --max-new-tokens 2, from the evaluator
    assert "areno eval (toyeval/task)" in capsys.readouterr().out


def test_eval_with_files_samples_pass_at_k_for_each_checkpoint(tmp_path, data) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text("def reward_fn(record):\n    return float(len(record.completion) % 2 == 0)\n")
    loader = tmp_path / "loader.py"
    loader.write_text(
        "def loader(row):\n    return {'prompt': row['question'], 'answer': row['answer']}\n"
    )
    out = tmp_path / "report.json"
    run_areno("eval", "--ckpt", "random:qwen3-tiny", "--ckpt", "random:qwen3-tiny?seed=1",
              "--dataset-path", str(data), "--dataset-loader-fn", f"{loader}:loader",
              "--reward-fn-path", str(reward), "--max-new-tokens", "4",
              "--max-prompt-tokens", "64", "--n-samples", "4", "--pass-k", "1,2,4",
              "--output", str(out))  # fmt: skip
    report = json.loads(out.read_text())
    assert report["settings"]["pass_k"] == [1, 2, 4] and report["settings"]["n_samples"] == 4
    assert [r["checkpoint"] for r in report["results"]] == [
        "random:qwen3-tiny", "random:qwen3-tiny?seed=1"
    ]  # fmt: skip
    for result in report["results"]:
        m = result["metrics"]
        # rewards are 0 or 1, so pass@1 is the share of right samples
        assert m["pass@1"] == pytest.approx(m["sampled_reward_mean"])
        assert m["pass@1"] <= m["pass@2"] <= m["pass@4"] <= 1.0
        assert m["prompts"] == 3.0 and m["reward_errors"] == 0.0


def test_find_checkpoints_expands_a_run_and_passes_other_references_through(tmp_path) -> None:
    run = tmp_path / "run"
    for step in (10, 2):
        (run / f"step_{step}").mkdir(parents=True)
        (run / f"step_{step}" / "config.json").write_text("{}")
    (run / "tensorboard").mkdir()
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    found = find_checkpoints([str(run), str(adapter), "Qwen/Qwen3-0.6B", str(run / "step_2")])
    assert [(c.path, c.step) for c in found] == [
        (str(run / "step_2"), 2),
        (str(run / "step_10"), 10),
        (str(adapter), None),
        ("Qwen/Qwen3-0.6B", None),
    ]  # fmt: skip  (step_2 given twice is evaluated once)
    assert found[3] == CheckpointRef("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ckpt", "random:qwen3-tiny"], "areno eval needs --dataset-path and --reward-fn-path"),
        (["--ckpt", "./no/such/dir", "--recipe", "math/arith"], "no such checkpoint directory"),
        (
            [
                "--ckpt",
                "random:qwen3-tiny",
                "--recipe",
                "math/arith",
                "--pass-k",
                "4",
                "--n-samples",
                "2",
            ],
            "--pass-k 4 is not between 1 and --n-samples 2",
        ),
        (
            ["--ckpt", "random:qwen3-tiny", "--recipe", "math/arith", "--pass-k", "2"],
            "--pass-k needs --n-samples",
        ),
        (["--ckpt", "random:qwen3-tiny", "--recipe", "math/nope"], "unknown recipe 'math/nope'"),
        (
            ["--ckpt", "random:qwen3-tiny", "--recipe", "math/arith", "--rollout-engine", "vllm"],
            "unknown rollout engine 'vllm'",
        ),
    ],
)
@pytest.mark.usefixtures("installed_plugins_only")
def test_bad_input_is_a_clear_error_before_any_model_loads(args, message, tmp_path, capsys):
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as exc:
        main(["eval", *args, "--output", str(out)])
    assert exc.value.code == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_missing_local_paths_are_refused_and_hub_ids_are_not(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for ref in ("runs/demo", "runs/demo/step_5", "./demo", str(tmp_path / "x")):
        with pytest.raises(ConfigError, match=f"--ckpt '{ref}': no such checkpoint directory"):
            find_checkpoints([ref])
    assert [c.path for c in find_checkpoints(["Qwen/Qwen3-0.6B", "gpt2"])] == [
        "Qwen/Qwen3-0.6B", "gpt2"
    ]  # fmt: skip


def test_directory_without_a_model_or_steps_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no model .* and no step_N checkpoints"):
        find_checkpoints([str(tmp_path)])


@pytest.mark.usefixtures("installed_plugins_only")
def test_output_that_is_a_directory_is_refused_before_loading(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--recipe", "math/arith", "--ckpt", "random:qwen3-tiny",
              "--output", str(tmp_path)])  # fmt: skip
    assert "is a directory; give a file name" in capsys.readouterr().err

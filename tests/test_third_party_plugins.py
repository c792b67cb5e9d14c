"""A third-party algorithm and a third-party rollout engine, each an installed distribution
(a real ``.dist-info`` with an ``areno`` entry point), add their own flags and train end to end.

- the algorithm's ``--nll-scale`` reaches its loss from a flag, from ``--config`` YAML and from
  a recipe; it shows in ``--help`` in a section of its own;
- the engine keeps its own copy of the weights and depends on ``sync_weights``: its
  ``--copycat-log`` option records every sync, the versions follow the optimizer steps, each
  step samples from the policy of the step before, and after the run its copy equals the
  trained policy;
- two plugins declaring one option differently, or a plugin re-declaring a core option, stop
  ``areno train`` with a ``PluginError`` naming both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from areno_core.testing import run_areno
from areno_core.train.checkpoint import read_weights

SCALED_SFT_SOURCE = """
import attrs
import torch

from areno_core import hookimpl, option
from areno_core.algorithm import AlgorithmSpec, RowSchema
from areno_core.recipe import Recipe
from areno_core.validators import number


@attrs.frozen
class ScaledSFTConfig:
    nll_scale: float = option(
        1.0, "Multiply the SFT loss by this.", validator=number(min=0.0, min_inclusive=False)
    )


def scaled_sft_loss(outputs, batch, config):
    mask = batch["loss_mask"]
    nll = -(outputs["logprobs"] * mask).sum() / batch["group_loss_tokens"]
    rows = torch.tensor(float(mask.shape[0])) / batch["group_sequences"]
    stats = {"train/nll": nll.detach(), "train/nll_scale": rows * config.nll_scale}
    return config.nll_scale * nll, stats


SCALED_SFT = AlgorithmSpec(
    name="scaled_sft",
    summary="SFT with the loss multiplied by --nll-scale.",
    kind="supervised",
    row_schema=RowSchema(required={"prompt": (str,), "response": (str,)}),
    config_cls=ScaledSFTConfig,
    loss=scaled_sft_loss,
)


@hookimpl
def register_algorithms(register):
    register(SCALED_SFT)


@hookimpl
def register_recipes(register):
    register(
        Recipe(
            "scaledpack/quarter",
            "scaled SFT at a quarter of the loss",
            ("scaled_sft",),
            algorithm_defaults={"scaled_sft": {"nll_scale": 0.25}},
        )
    )
"""

COPYCAT_SOURCE = """
import copy
import json

import attrs
import torch

from areno_core import hookimpl, option
from areno_core.contracts.engine import EngineSpec
from areno_core.rollout.native import NativeEngine


@attrs.frozen
class CopycatConfig:
    copycat_log: str | None = option(None, "Copycat engine: append every weight sync here.")


class CopycatEngine(NativeEngine):
    # The native engine over a private copy of the policy: it follows training only through
    # sync_weights.

    def __init__(self, policy, tokenizer, options, config):
        super().__init__(copy.deepcopy(policy), tokenizer, options)
        self.log = config.copycat_log

    def sync_weights(self, weights, *, version):
        super().sync_weights(weights, version=version)
        if self.log:
            total = sum(float(p.detach().double().sum()) for p in self.model.parameters())
            with open(self.log, "a") as f:
                f.write(json.dumps({"version": version, "checksum": total}) + "\\n")


@hookimpl
def register_rollout_engines(register):
    register(
        EngineSpec(
            name="copycat",
            summary="The native engine over its own copy of the weights.",
            factory=CopycatEngine,
            config_cls=CopycatConfig,
        )
    )
"""

RL_ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
REWARD = "def reward_fn(record):\n    return float(len(record.completion) % 2)\n"


@pytest.fixture
def sft_rows(tmp_path: Path) -> Path:
    path = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"Q{i}: 2+{i}?", "response": f" {2 + i}"} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _metrics(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]


def _sft_args(data: Path, out: Path) -> list[str]:
    return [
        "train", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(data),
        "--batch-size", "4", "--mini-bs", "4", "--max-steps", "1", "--lr", "1e-3",
        "--no-activation-checkpointing", "--metrics-log-dir", str(out),
    ]  # fmt: skip


def test_third_party_algorithm_flag_reaches_its_loss_from_flag_yaml_and_recipe(
    install_areno_plugin, monkeypatch, sft_rows, tmp_path, capsys
):
    monkeypatch.setenv("ARENO_PLUGINS", "scaled_pack")
    install_areno_plugin("scaled-pack", "scaled_pack", SCALED_SFT_SOURCE)

    run_areno("train", "--help")
    help_text = capsys.readouterr().out
    assert "Algorithm scaled_sft (scaled-pack):" in help_text
    section = help_text.split("Algorithm scaled_sft (scaled-pack):")[1]
    assert "--nll-scale FLOAT" in section and "Multiply the SFT loss by this." in section

    run_areno(*_sft_args(sft_rows, tmp_path / "flag"), "--algo", "scaled_sft", "--nll-scale", "0.5")
    config = tmp_path / "run.yaml"
    config.write_text("algo: scaled_sft\nalgorithm:\n  nll_scale: 0.75\n")
    run_areno(*_sft_args(sft_rows, tmp_path / "yaml"), "--config", str(config))
    run_areno(*_sft_args(sft_rows, tmp_path / "recipe"), "--recipe", "scaledpack/quarter")

    for name, scale in (("flag", 0.5), ("yaml", 0.75), ("recipe", 0.25)):
        [row] = _metrics(tmp_path / name)
        assert row["train/nll_scale"] == pytest.approx(scale), name
        assert row["train/loss"] == pytest.approx(scale * row["train/nll"], rel=1e-5), name
        recorded = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        assert recorded["algorithm"] == {"nll_scale": scale}, name


def test_third_party_algorithm_bad_option_value_fails_before_loading(
    install_areno_plugin, monkeypatch, sft_rows, tmp_path, capsys
):
    from areno_core.cli.main import main

    monkeypatch.setenv("ARENO_PLUGINS", "scaled_pack")
    install_areno_plugin("scaled-pack", "scaled_pack", SCALED_SFT_SOURCE)
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exit_info:
        main([*_sft_args(sft_rows, out), "--algo", "scaled_sft", "--nll-scale", "0"])
    assert exit_info.value.code == 2
    assert "--nll-scale must be > 0, got 0.0" in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_third_party_engine_flag_and_weight_sync_follow_training(
    install_areno_plugin, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("ARENO_PLUGINS", "algos,copycat_engine")
    install_areno_plugin("copycat-engine", "copycat_engine", COPYCAT_SOURCE)
    run_areno("train", "--help")
    help_text = capsys.readouterr().out
    assert "Rollout engine copycat (copycat-engine):" in help_text
    assert "--copycat-log TEXT" in help_text

    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RL_ROWS))
    (tmp_path / "reward.py").write_text(REWARD)
    log = tmp_path / "syncs.jsonl"
    run_areno(
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(data),
        "--reward-fn-path", str(tmp_path / "reward.py"), "--rollout-engine", "copycat",
        "--copycat-log", str(log), "--batch-size", "2", "--n-samples", "4", "--mini-bs", "4",
        "--gradient-accumulation-steps", "1",
        "--max-new-tokens", "4", "--max-steps", "3", "--lr", "1e-2", "--save-path",
        str(tmp_path / "run"), "--no-activation-checkpointing",
    )  # fmt: skip

    rows = _metrics(tmp_path / "run" / "tensorboard")
    # 2 prompts x 4 samples in microbatches of 4, one per optimizer step: two per trainer step
    assert [r["train/optimizer_steps"] for r in rows] == [2.0, 2.0, 2.0]
    assert [r["rollout/policy_version"] for r in rows] == [0.0, 2.0, 4.0]
    assert [r["rollout/policy_lag"] for r in rows] == [0.0, 0.0, 0.0]
    syncs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["version"] for s in syncs] == [0, 2, 4, 6]
    assert len({s["checksum"] for s in syncs}) == 4  # every sync brought new weights
    final = read_weights(tmp_path / "run" / "step_3")
    expected = sum(float(t.double().sum()) for k, t in final.items() if "lm_head" not in k)
    tied = "lm_head.weight" not in final or torch.equal(
        final["lm_head.weight"], final["model.embed_tokens.weight"]
    )
    if not tied:
        expected += float(final["lm_head.weight"].double().sum())
    assert syncs[-1]["checksum"] == pytest.approx(expected, rel=1e-9)
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert recorded["rollout_engine"] == {"copycat_log": str(log)}


CLASH_A = """
import attrs
from areno_core import hookimpl, option
from areno_core.algorithm import AlgorithmSpec, RowSchema


@attrs.frozen
class Config:
    shared_knob: float = option(1.0, "A knob.")


def _loss(outputs, batch, config):
    return (outputs["logprobs"] * 0).sum(), {}


@hookimpl
def register_algorithms(register):
    register(AlgorithmSpec(name="NAME", summary="s", kind="supervised",
        row_schema=RowSchema(required={"prompt": (str,)}), config_cls=Config, loss=_loss))
"""


def test_two_plugins_declaring_one_option_alike_share_it(install_areno_plugin, monkeypatch, capsys):
    monkeypatch.setenv("ARENO_PLUGINS", "clash_one,clash_two")
    install_areno_plugin("clash-one", "clash_one", CLASH_A.replace("NAME", "one"))
    registry = install_areno_plugin("clash-two", "clash_two", CLASH_A.replace("NAME", "two"))
    assert {"one", "two"} <= set(registry.names("algorithms")) and not registry.failures
    assert registry.options.owners("shared_knob")[1].name == "two"
    run_areno("train", "--help")
    assert capsys.readouterr().out.count("--shared-knob FLOAT") == 2  # in both sections


def test_an_option_declared_otherwise_disables_only_the_later_plugin(
    install_areno_plugin, monkeypatch, capsys, tmp_path
):
    """A third-party pack whose option clashes with an installed plugin's loses: it is
    reported (naming both plugins and both declarations) and disabled; every command, and
    every other plugin, keeps working."""
    monkeypatch.setenv("ARENO_PLUGINS", "clash_one,clash_two,algos")
    install_areno_plugin("clash-one", "clash_one", CLASH_A.replace("NAME", "one"))
    second = CLASH_A.replace("NAME", "two").replace("option(1.0", "option(2.0")
    registry = install_areno_plugin("clash-two", "clash_two", second)
    assert "one" in registry.names("algorithms") and "two" not in registry.names("algorithms")
    assert "grpo" in registry.names("algorithms")  # areno-algos is untouched
    [failure] = registry.failures
    text = " ".join(failure.error.split())
    assert failure.distribution == "clash-two"
    assert "option --shared-knob is declared differently by algorithm one (clash-one)" in text
    assert "(float, default 1.0) and by algorithm two (clash-two) (float, default 2.0)" in text
    assert text.endswith("The plugin is disabled.")
    assert registry.options.owners("shared_knob")[0].name == "one"

    run_areno("plugins")
    out = " ".join(capsys.readouterr().out.split())
    assert "failed: plugin 'clash_two' from clash-two" in out and "declared differently" in out
    run_areno("train", "--help")
    assert capsys.readouterr().out.count("--shared-knob FLOAT") == 1
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "completion": "2"}\n')
    run_areno(
        "train", "--algo", "sft", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(rows),
        "--dry-run",
    )  # fmt: skip
    assert "algo: sft" in capsys.readouterr().out


def test_plugin_option_named_like_a_core_option_disables_that_plugin(
    install_areno_plugin, monkeypatch
):
    monkeypatch.setenv("ARENO_PLUGINS", "clash_core")
    source = CLASH_A.replace("NAME", "lr_algo").replace("shared_knob", "lr")
    registry = install_areno_plugin("clash-core", "clash_core", source)
    assert "lr" in registry.options and registry.options.is_core("lr")
    assert "lr_algo" not in registry.names("algorithms")
    [failure] = registry.failures
    assert "algorithm lr_algo (clash-core) declares the option --lr, which areno-core" in (
        " ".join(failure.error.split())
    )


def test_plugin_option_without_help_is_refused_at_registration(install_areno_plugin, monkeypatch):
    monkeypatch.setenv("ARENO_PLUGINS", "no_help")
    source = CLASH_A.replace("NAME", "nohelp").replace('option(1.0, "A knob.")', "1.0")
    registry = install_areno_plugin("no-help", "no_help", source)
    assert "nohelp" not in registry.names("algorithms")
    [failure] = [f for f in registry.failures if f.distribution == "no-help"]
    assert "option 'shared_knob' has no help text" in failure.error


PICKY_ENGINE = """
from areno_core import hookimpl
from areno_core.contracts.engine import EngineSpec
from areno_core.rollout.native import NativeEngine


def _check(run_config, config):
    return "it needs a widget this machine lacks"


@hookimpl
def register_rollout_engines(register):
    register(EngineSpec(name="picky", summary="s", factory=NativeEngine, check=_check))
"""


def test_engine_check_stops_the_run_before_loading_but_not_a_dry_run(
    install_areno_plugin, monkeypatch, tmp_path, capsys
):
    from areno_core.cli.main import main

    monkeypatch.setenv("ARENO_PLUGINS", "algos,picky_engine")
    install_areno_plugin("picky-engine", "picky_engine", PICKY_ENGINE)
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RL_ROWS))
    (tmp_path / "reward.py").write_text(REWARD)
    args = [
        "train", "--algo", "grpo", "--rollout-engine", "picky", "--dataset-path", str(data),
        "--ckpt", str(tmp_path / "no-such-model"), "--reward-fn-path", str(tmp_path / "reward.py"),
        "--save-path", str(tmp_path / "run"),
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--rollout-engine picky: it needs a widget this machine lacks" in err
    assert not (tmp_path / "run").exists()
    run_areno(*args, "--dry-run")  # a dry run resolves options only

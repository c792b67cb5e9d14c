"""--tune-params for real on a CPU: random-weight probes of a tiny Qwen3 against system RAM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from areno_core.cli.main import main
from areno_core.config import build_config
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.models.scratch import build_random_config
from areno_core.testing import run_areno
from areno_core.tune.checks import check_tunable
from areno_core.tune.probes import kv_cache_bytes, synthetic_groups

REPO = Path(__file__).resolve().parents[2]
LOADER = "def load_row(row):\n    return {'prompt': row['question'][:40]}\n"
REWARD = "def reward_fn(record):\n    return float(len(record.completion) % 2)\n"

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tune")
    with (REPO / "data" / "gsm8k" / "train.jsonl").open() as f:
        (root / "rows.jsonl").write_text("".join(next(f) for _ in range(16)))
    (root / "loader.py").write_text(LOADER)
    (root / "reward.py").write_text(REWARD)
    return {"rows": root / "rows.jsonl", "loader": root / "loader.py", "reward": root / "reward.py"}


def _argv(inputs, run: Path, *extra: str) -> list[str]:
    return [
        "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny",
        "--dataset-path", str(inputs["rows"]), "--dataset-loader-fn", str(inputs["loader"]),
        "--reward-fn-path", str(inputs["reward"]), "--n-samples", "4", "--max-prompt-tokens",
        "64", "--max-new-tokens", "8", "--attn-backend", "native", "--max-steps", "1",
        "--tune-params", "--tune-max-samples", "16", "--save-path", str(run), *extra,
    ]  # fmt: skip


def test_tune_params_on_cpu_fills_values_writes_them_and_trains(inputs, tmp_path, capsys):
    run = tmp_path / "run"
    run_areno(*_argv(inputs, run))
    out = " ".join(capsys.readouterr().out.split())
    assert "--tune-params measured process memory (RSS) against system RAM" in out
    config = yaml.safe_load((run / "config.yaml").read_text())
    # A tiny model fits everything in a machine's RAM: the largest candidates win.
    assert config["rollout"]["max_running_prompts"] == 16
    assert config["rollout"]["batch_size"] == 4  # 16 rows // 4 samples
    assert config["train"]["mini_bs"] == 16  # the step's 4 x 4 rows in one microbatch
    assert config["rollout"]["drop_rollout_state"] is True
    assert config["rollout"]["tune_params"] is False  # the config replays the tuned run
    tune = yaml.safe_load((run / "tune.yaml").read_text())
    assert tune["chosen"] == {"max_running_prompts": 16, "batch_size": 4, "mini_bs": 16}
    assert [(t["phase"], t["value"], t["verdict"]) for t in tune["trials"]] == [
        ("rollout", 16, "fits"),
        ("train", 16, "fits"),
    ]
    # The probes measured real memory: at least the process that runs torch.
    assert all(t["peak_mib"] > 100 for t in tune["trials"])
    assert tune["budget_mib"] == pytest.approx(0.9 * tune["capacity_mib"], abs=0.1)
    metrics = (run / "tensorboard" / "metrics.jsonl").read_text()
    assert '"rollout/samples": 16.0' in metrics and "memory/train_peak_mib" in metrics


def test_tune_params_with_lora_probes_the_adapted_policy_and_trains_adapters(
    inputs, tmp_path, monkeypatch
):
    from areno_core.model import TrainableModel

    attached = []
    real = TrainableModel.add_lora

    def spy(self, settings):
        attached.append(settings.rank)
        return real(self, settings)

    monkeypatch.setattr(TrainableModel, "add_lora", spy)
    run = tmp_path / "run"
    run_areno(*_argv(inputs, run, "--lora-rank", "4"))
    assert attached == [4, 4]  # the probe's random-weight model, then the run's policy
    tune = yaml.safe_load((run / "tune.yaml").read_text())
    assert [t["phase"] for t in tune["trials"]] == ["rollout", "train"]
    assert (run / "step_1" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_tune_params_keeps_given_values(inputs, tmp_path):
    run = tmp_path / "run"
    run_areno(*_argv(inputs, run, "--max-running-prompts", "6", "--mini-bs", "2"))
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["rollout"]["max_running_prompts"] == 6
    assert config["rollout"]["batch_size"] == 1  # 6 // 4
    assert config["train"]["mini_bs"] == 2
    tune = yaml.safe_load((run / "tune.yaml").read_text())
    assert [(t["phase"], t["value"]) for t in tune["trials"]] == [("train", 2)]  # no rollout


def test_tune_params_without_room_fails_clearly_and_writes_nothing(inputs, tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(_argv(inputs, run, "--mem-frac", "0.001"))
    assert exc.value.code != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "--tune-params: even a rollout of 1 sequence at a time does not fit" in err
    assert "--mem-frac 0.001" in err
    assert not run.exists()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"algo": "sft"}, ConfigError, "--algo sft \\(supervised\\) does not roll out"),
        ({"resume": "auto"}, ConfigError, "cannot change the batch of a run being resumed"),
        ({"world_size": 2}, NotAvailableError, "not available with --world-size 2"),
    ],
)
def test_check_tunable_refuses_runs_it_cannot_tune(options, error, message):
    from areno_core.registry import get_registry

    cfg = build_config({"tune_params": True, "world_size": 1, "tp_size": 1, **options})
    spec = get_registry().algorithm(cfg.algo)
    with pytest.raises(error, match=message):
        check_tunable(cfg, spec)
    check_tunable(cfg.replace(tune_params=False), spec)  # nothing to check without it


@pytest.mark.parametrize(
    ("typed", "named"),
    [
        (["--mem-frac", "0.5"], "--mem-frac"),
        (["--tune-max-samples", "64"], "--tune-max-samples"),
        (["--mem-frac", "0.5", "--tune-max-samples", "64"], "--mem-frac, --tune-max-samples"),
    ],
)
def test_tuner_setting_without_tune_params_is_refused_before_anything_loads(
    capsys, inputs, tmp_path, typed, named
):
    run = tmp_path / "run"
    argv = [a for a in _argv(inputs, run) if a != "--tune-params"]
    del argv[argv.index("--tune-max-samples") : argv.index("--tune-max-samples") + 2]
    with pytest.raises(SystemExit) as exc:
        main([*argv, *typed])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"Error: {named} only applies with --tune-params" in err
    assert not run.exists()


def test_tuned_runs_own_config_restating_mem_frac_is_accepted():
    from areno_core.registry import get_registry

    # What a tuned run writes to config.yaml: tune_params false, its --mem-frac kept.
    cfg = build_config({"tune_params": False, "mem_frac": 0.5})
    check_tunable(cfg, get_registry().algorithm(cfg.algo), flags={"resume"})


def test_kv_cache_bytes_of_qwen3_tiny():
    config = build_random_config("random:qwen3-tiny")
    per_token = (
        config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 2
    )  # bfloat16: 2 bytes
    assert kv_cache_bytes(config, 3, 10, torch.bfloat16) == 3 * 10 * per_token


def test_synthetic_groups_have_the_runs_lengths_and_group_sizes():
    groups = synthetic_groups(10, n_samples=4, prompt_tokens=5, total_tokens=12, vocab=50)
    assert [len(g.trajectories) for g in groups] == [4, 4, 2]
    for g in groups:
        prompts = {tuple(t.input_ids[:5]) for t in g.trajectories}
        assert len(prompts) == 1  # the samples of a group share their prompt
        for t in g.trajectories:
            assert len(t.input_ids) == 12 and sum(t.loss_mask) == 7
            assert max(t.input_ids) < 50
    assert {t.reward for t in groups[0].trajectories} == {0.0, 1.0}

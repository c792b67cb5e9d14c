"""Config classes: CLI defaults, validator messages, and building from run options."""

from __future__ import annotations

import attrs
import pytest
from areno_algos.dpo import DPOConfig
from areno_algos.grpo import GRPOConfig
from areno_algos.gspo import GSPOConfig
from areno_algos.plugin import ALGORITHMS
from areno_algos.ppo import PPOConfig
from areno_algos.rloo import RLOOConfig

from areno_core.errors import ConfigError


def test_configs_defaults_match_cli_defaults() -> None:
    assert attrs.asdict(DPOConfig()) == {"dpo_beta": 0.1}
    assert attrs.asdict(GRPOConfig()) == {
        "grpo_clip_eps": 0.2,
        "grpo_clip_eps_high": None,
        "scale_rewards": True,
        "loss_agg": None,
    }
    assert attrs.asdict(GSPOConfig()) == {
        "gspo_clip_eps": 3e-4,
        "gspo_clip_eps_high": 4e-4,
        "loss_agg": None,
    }
    assert attrs.asdict(RLOOConfig()) == {"clip_eps": 0.2, "loss_agg": None}
    assert attrs.asdict(PPOConfig()) == {
        "clip_eps": 0.2,
        "clip_ratio_c": 3.0,
        "value_clip_eps": 0.5,
        "value_loss_coef": 0.5,
        "gamma": 1.0,
        "lam": 0.95,
        "use_kl_loss": True,
        "kl_loss_coef": 0.001,
        "kl_loss_type": "low_var_kl",
        "loss_agg": None,
    }


def test_grpo_config_eps_high_unset_follows_eps() -> None:
    assert GRPOConfig(grpo_clip_eps=0.3).eps_high == 0.3
    assert GRPOConfig(grpo_clip_eps=0.2, grpo_clip_eps_high=0.28).eps_high == 0.28


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GRPOConfig(grpo_clip_eps=-0.1), "--grpo-clip-eps must be >= 0, got -0.1"),
        (lambda: GRPOConfig(grpo_clip_eps_high=-1), "--grpo-clip-eps-high must be >= 0, got -1"),
        (
            lambda: GRPOConfig(scale_rewards="yes"),
            "--scale-rewards must be true or false, got 'yes'",
        ),
        (
            lambda: GRPOConfig(loss_agg="mean"),
            "--loss-agg must be one of token-mean, seq-mean-token-mean, seq-mean-token-sum, "
            "got 'mean'",
        ),
        (lambda: GSPOConfig(gspo_clip_eps=-3e-4), "--gspo-clip-eps must be >= 0, got -0.0003"),
        (
            lambda: GSPOConfig(gspo_clip_eps_high=None),
            "--gspo-clip-eps-high cannot be empty (null)",
        ),
        (lambda: DPOConfig(dpo_beta=0.0), "--dpo-beta must be > 0, got 0.0"),
        (lambda: RLOOConfig(clip_eps=-0.2), "--clip-eps must be >= 0, got -0.2"),
        (lambda: PPOConfig(clip_ratio_c=1.0), "--clip-ratio-c must be > 1, got 1.0"),
        (lambda: PPOConfig(gamma=1.5), "--gamma must be <= 1, got 1.5"),
        (lambda: PPOConfig(lam=-0.5), "--lam must be >= 0, got -0.5"),
        (lambda: PPOConfig(value_clip_eps=-1.0), "--value-clip-eps must be >= 0, got -1.0"),
        (lambda: PPOConfig(kl_loss_coef=-0.001), "--kl-loss-coef must be >= 0, got -0.001"),
        (
            lambda: PPOConfig(value_loss_coef=True),
            "--value-loss-coef must be a finite number, got True",
        ),
        (
            lambda: PPOConfig(kl_loss_type="k4"),
            "--kl-loss-type must be one of k1, k2, k3, low_var_kl, got 'k4'",
        ),
    ],
)
def test_config_invalid_value_raises_configerror_naming_option(make, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_ppo_config_kl_loss_type_accepts_every_estimator(kind: str) -> None:
    assert PPOConfig(kl_loss_type=kind).kl_loss_type == kind


def test_make_config_mapping_of_run_options_picks_own_fields() -> None:
    specs = {spec.name: spec for spec in ALGORITHMS}
    options = {"grpo_clip_eps": 0.3, "clip_eps": 0.1, "dpo_beta": 0.5, "lr": 1e-6}
    assert specs["grpo"].make_config(options) == GRPOConfig(grpo_clip_eps=0.3)
    assert specs["rloo"].make_config(options) == RLOOConfig(clip_eps=0.1)
    assert specs["ppo"].make_config(options) == PPOConfig(clip_eps=0.1)
    assert specs["dpo"].make_config(options) == DPOConfig(dpo_beta=0.5)


def test_config_fields_all_have_help_metadata() -> None:
    for spec in ALGORITHMS:
        for field in attrs.fields(spec.config_cls):
            assert field.metadata.get("help"), f"{spec.name}.{field.name} has no help"

"""Resolving a run: plugin options, options for roles an algorithm has not, the backend choice,
the device-count default, and what a run records."""

from __future__ import annotations

import logging

import pytest
import yaml

from areno_core import resolve
from areno_core.config import build_config, dump_yaml
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.registry import get_registry
from areno_core.resolve import resolve_run

BASE = {"ckpt": "random:qwen3-tiny", "dataset_path": "rows.jsonl"}
pytestmark = pytest.mark.usefixtures("installed_plugins_only")


def _resolve(**flags):
    return resolve_run({**BASE, **flags}, registry=get_registry())


def test_algorithm_options_reach_the_algorithm_config():
    resolved = _resolve(algo="grpo", grpo_clip_eps=0.3, scale_rewards=False)
    assert resolved.algorithm.name == "grpo"
    assert resolved.algorithm_config.grpo_clip_eps == 0.3
    assert resolved.algorithm_config.scale_rewards is False
    assert resolved.engine is not None and resolved.engine.name == "native"
    assert resolved.backend is not None and resolved.backend.name == "local"


def test_bad_algorithm_option_value_names_the_flag():
    with pytest.raises(ConfigError, match="--dpo-beta must be > 0, got -1.0"):
        _resolve(algo="dpo", dpo_beta=-1.0)


def test_option_of_another_algorithm_is_named_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="areno"):
        resolved = _resolve(algo="gspo", grpo_clip_eps=0.3)
    [warning] = [r.getMessage() for r in caplog.records if "--grpo-clip-eps" in r.getMessage()]
    assert warning == (
        "--grpo-clip-eps is an option of algorithm grpo (areno-algos); this run (--algo gspo) "
        "does not read it"
    )
    assert not hasattr(resolved.algorithm_config, "grpo_clip_eps")


def test_shared_option_is_quiet_for_either_owner(caplog):
    with caplog.at_level(logging.WARNING, logger="areno"):
        assert _resolve(algo="rloo", clip_eps=0.1).algorithm_config.clip_eps == 0.1
        assert _resolve(algo="ppo", clip_eps=0.3).algorithm_config.clip_eps == 0.3
    assert not [r for r in caplog.records if "--clip-eps" in r.getMessage()]


def test_role_option_for_an_algorithm_without_the_role_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="areno"):
        _resolve(algo="grpo", critic_lr=1e-4, reward_fn_path="r.py")
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "--critic-lr applies to algorithms that use a critic (ppo); --algo grpo does not"
        in messages
    )


def test_reward_model_for_an_algorithm_without_the_role_is_an_error():
    with pytest.raises(ConfigError, match="--reward-ckpt applies to algorithms that use a reward"):
        _resolve(algo="grpo", reward_ckpt="some/model")
    assert _resolve(algo="ppo", reward_ckpt="some/model").config.reward_ckpt == "some/model"


def test_several_devices_resolve_to_the_distributed_backend():
    resolved = _resolve(algo="sft", world_size=8, tp_size=4)
    assert resolved.backend.name == "distributed"
    assert resolved.to_dict()["basic"]["world_size"] == 8
    assert _resolve(algo="sft").backend.name == "local"  # one process stays local
    assert _resolve(algo="sft", backend="distributed").backend.name == "distributed"


def test_several_devices_without_a_backend_for_them_fail_before_any_work():
    with pytest.raises(NotAvailableError) as info:
        _resolve(algo="sft", world_size=2, adam_8bit=True)
    # The distributed backend runs two processes: its own reason comes first, and alone.
    assert str(info.value) == (
        "--world-size 2 --tp-size 1: the distributed backend cannot run this configuration: "
        "8-bit Adam (--adam-8bit) keeps state FSDP2 cannot shard; drop --adam-8bit"
    )
    with pytest.raises(NotAvailableError, match="--backend local cannot run this configuration"):
        _resolve(algo="sft", world_size=2, backend="local")
    with pytest.raises(ConfigError, match="unknown training backend 'locl'. Did you mean 'local'"):
        _resolve(algo="sft", backend="locl")
    dry = resolve_run(
        {**BASE, "algo": "sft", "world_size": 2, "adam_8bit": True},
        registry=get_registry(),
        check_capabilities=False,
    )
    assert dry.backend is None


def test_lora_dropout_with_tensor_parallel_names_the_dropout_not_the_backend_count():
    pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")
    with pytest.raises(NotAvailableError) as info:
        _resolve(algo="sft", world_size=2, tp_size=2, lora_rank=4, lora_dropout=0.1)
    assert str(info.value).startswith(
        "--world-size 2 --tp-size 2: the distributed backend cannot run this configuration: "
        "--lora-dropout 0.1 with --tp-size 2"
    )
    assert "install a backend that runs several devices" not in str(info.value)


def test_no_backend_for_the_size_still_says_to_install_one(monkeypatch):
    registry = get_registry()
    monkeypatch.delitem(registry.entries["backends"], "distributed")
    with pytest.raises(NotAvailableError) as info:
        resolve.choose_backend(build_config({**BASE, "world_size": 2, "tp_size": 1}), registry)
    assert str(info.value) == (
        "no installed training backend runs --world-size 2 --tp-size 1 (local: it trains in "
        "one process on one device (--world-size 1 --tp-size 1)). Use --world-size 1 "
        "--tp-size 1, or install a backend that runs several devices"
    )


def test_distributed_backend_refuses_a_low_precision_dtype_and_tune_params():
    with pytest.raises(NotAvailableError) as info:
        _resolve(algo="sft", world_size=2, dtype="bfloat16")
    assert (
        "distributed backend cannot run this configuration: --dtype bfloat16: parameters "
        "stay float32 under FSDP2" in str(info.value)
    )
    with pytest.raises(NotAvailableError) as info:
        _resolve(algo="grpo", reward_fn_path="r.py", world_size=2, tune_params=True)
    assert str(info.value).startswith(
        "--world-size 2 --tp-size 1: the distributed backend cannot run this configuration: "
        "--tune-params probes one process's memory"
    )
    assert "install a backend" not in str(info.value)
    assert _resolve(algo="sft", world_size=2, dtype="float32").backend.name == "distributed"


def test_world_size_under_torchrun_defaults_to_the_launchers(monkeypatch):
    env = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h"}
    for name, value in {**env, "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    resolved = _resolve(algo="sft")
    assert resolved.config.world_size == 4 and resolved.backend.name == "distributed"


def test_machine_with_several_gpus_defaults_to_one_device_with_a_notice(monkeypatch, caplog):
    monkeypatch.setattr(resolve, "machine_device_count", lambda: 4)
    with caplog.at_level(logging.WARNING, logger="areno"):
        resolved = _resolve(algo="sft")
    assert resolved.config.world_size == 1 and resolved.backend.name == "local"
    notices = [r.getMessage() for r in caplog.records if "--world-size" in r.getMessage()]
    assert notices == [
        "this machine has 4 GPUs; areno trains on one unless you pass --world-size "
        "(e.g. --world-size 4)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="areno"):
        _resolve(algo="sft", world_size=1)
    assert not [r for r in caplog.records if "--world-size" in r.getMessage()]


def test_resolved_dict_records_plugin_options_and_reloads(tmp_path):
    resolved = _resolve(algo="ppo", gamma=0.9, prefill_batch_tokens=512, reward_fn_path="r.py")
    data = resolved.to_dict()
    assert data["algorithm"]["gamma"] == 0.9 and data["algorithm"]["lam"] == 0.95
    assert data["rollout_engine"] == {
        "prefill_batch_tokens": 512,
        "lean_forward": True,
        "shared_prompt_cache": None,
        "prepacked_weights": True,
    }
    assert data["backend"] == {"share_prefix": True, "packed_forward": None}
    dump_yaml(data, tmp_path / "config.yaml")
    again = resolve_run({}, registry=get_registry(), config_path=str(tmp_path / "config.yaml"))
    assert again.to_dict() == data
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["algorithm"]["gamma"] == 0.9


def test_offline_algorithm_records_no_engine_section():
    data = _resolve(algo="sft").to_dict()
    assert "rollout_engine" not in data and "algorithm" not in data  # sft has no options
    assert data["backend"] == {"share_prefix": True, "packed_forward": None}

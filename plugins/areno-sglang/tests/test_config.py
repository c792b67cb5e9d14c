"""The sglang engine's options and what is checked before a run loads a model."""

from __future__ import annotations

import types

import pytest
from areno_sglang import config as config_module
from areno_sglang.config import (
    SGLangEngineConfig,
    is_local,
    parse_urls,
    servers_for_rank,
    unavailable_reason,
)

from areno_core.errors import ConfigError


def _run(world_size: int = 1, tp_size: int = 1, tune: bool = False) -> types.SimpleNamespace:
    return types.SimpleNamespace(world_size=world_size, tp_size=tp_size, tune_params=tune)


def test_parse_urls_adds_the_scheme_strips_slashes_and_splits_on_commas():
    assert parse_urls(None) == []
    assert parse_urls(" ") == []
    assert parse_urls("http://a:1, b:2/ ,https://c.example:443") == [
        "http://a:1",
        "http://b:2",
        "https://c.example:443",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://host", "names no port"),
        ("ftp://host:1", "is not a server URL"),
        ("http://:80", "is not a server URL"),
        ("http://a:1,a:1", "names a server twice"),
        ("http://a:99999", "has a bad port"),
    ],
)
def test_parse_urls_bad_url_is_a_config_error_naming_it(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_urls(text)


def test_servers_for_rank_deals_servers_round_robin_over_ranks():
    urls = [f"http://s{i}:1" for i in range(5)]
    assert servers_for_rank(urls, 0, 1) == urls
    assert servers_for_rank(urls, 0, 2) == [urls[0], urls[2], urls[4]]
    assert servers_for_rank(urls, 1, 2) == [urls[1], urls[3]]
    with pytest.raises(ConfigError, match="2 server\\(s\\) for 3 data-parallel ranks"):
        servers_for_rank(urls[:2], 0, 3)


def test_mode_and_weight_sync_auto_follow_the_url():
    colocated = SGLangEngineConfig()
    assert (colocated.mode, colocated.weight_sync) == ("colocated", "tensor")
    remote = SGLangEngineConfig(sglang_url="localhost:30000")
    assert (remote.mode, remote.weight_sync, remote.urls) == (
        "remote",
        "disk",
        ["http://localhost:30000"],
    )
    chosen = SGLangEngineConfig(sglang_url="h:1", sglang_weight_sync="distributed")
    assert chosen.weight_sync == "distributed"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sglang_mode": "remote"}, "--sglang-mode remote needs --sglang-url"),
        ({"sglang_mode": "colocated", "sglang_url": "h:1"}, "is for --sglang-mode remote"),
        ({"sglang_weight_sync": "distributed"}, "distributed is for remote servers"),
        ({"sglang_mode": "cloud"}, "--sglang-mode must be one of"),
        ({"sglang_mem_fraction": 1.5}, "--sglang-mem-fraction must be"),
    ],
)
def test_bad_option_combination_is_a_config_error(options, message):
    with pytest.raises(ConfigError, match=message):
        SGLangEngineConfig(**options)


def test_colocated_without_the_sglang_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(config_module, "sglang_installed", lambda: False)
    why = unavailable_reason(_run(), SGLangEngineConfig())
    assert "the sglang package is not installed" in why
    assert "pip install areno-sglang" in why
    assert "--sglang-url" in why  # the way out without the package


def test_remote_mode_needs_neither_the_sglang_package_nor_a_gpu(monkeypatch):
    monkeypatch.setattr(config_module, "sglang_installed", lambda: False)
    assert unavailable_reason(_run(), SGLangEngineConfig(sglang_url="h:1")) is None


def test_tensor_sync_needs_the_package_and_a_gpu(monkeypatch):
    import torch

    config = SGLangEngineConfig(sglang_url="127.0.0.1:1", sglang_weight_sync="tensor")
    monkeypatch.setattr(config_module, "sglang_installed", lambda: False)
    assert "serializes CUDA tensors" in unavailable_reason(_run(), config)
    monkeypatch.setattr(config_module, "sglang_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "need a CUDA GPU" in unavailable_reason(_run(), config)


def test_distributed_sync_to_another_machine_needs_the_group_address():
    far = SGLangEngineConfig(sglang_url="gpu-box:30000", sglang_weight_sync="distributed")
    assert "--sglang-group-address" in unavailable_reason(_run(), far)
    given = SGLangEngineConfig(
        sglang_url="gpu-box:30000",
        sglang_weight_sync="distributed",
        sglang_group_address="10.0.0.2",
    )
    assert unavailable_reason(_run(), given) is None
    local = SGLangEngineConfig(sglang_url="127.0.0.1:30000", sglang_weight_sync="distributed")
    assert unavailable_reason(_run(), local) is None


def test_each_data_parallel_rank_needs_a_server():
    config = SGLangEngineConfig(sglang_url="h:1,h:2")
    assert unavailable_reason(_run(world_size=2), config) is None
    assert "runs 4 data-parallel ranks" in unavailable_reason(_run(world_size=4), config)
    assert unavailable_reason(_run(world_size=4, tp_size=2), config) is None


def test_tune_params_is_refused_naming_the_options_to_set():
    config = SGLangEngineConfig(sglang_url="h:1")
    assert unavailable_reason(_run(), config) is None
    why = unavailable_reason(_run(tune=True), config)
    assert "--tune-params" in why and "--max-running-prompts" in why


def test_is_local_knows_loopback_hosts():
    assert is_local("http://127.0.0.1:1") and is_local("http://localhost:1")
    assert not is_local("http://10.0.0.2:1")


def test_a_resumed_run_may_point_at_other_servers_but_not_change_what_it_trains(tmp_path):
    from areno_core.config import dump_yaml
    from areno_core.registry import get_registry
    from areno_core.resolve import resolve_run, resumed_config

    registry = get_registry()
    base = {"ckpt": "random:qwen3-tiny", "dataset_path": "rows.jsonl", "algo": "grpo"}
    engine = {"rollout_engine": "sglang", "sglang_url": "http://a:1"}
    saved = resolve_run({**base, **engine}, registry=registry)
    dump_yaml(saved.to_dict(), tmp_path / "config.yaml")
    table = registry.options

    moved = {"sglang_url": "http://b:2", "sglang_timeout_s": 30.0}
    again = resolve_run({**base, **engine, **moved}, registry=registry).config
    cfg = resumed_config(again, tmp_path, set(moved), table)
    assert cfg.plugin["sglang_url"] == "http://b:2" and cfg.plugin["sglang_timeout_s"] == 30.0

    again = resolve_run({**base, **engine, "grpo_clip_eps": 0.3}, registry=registry).config
    with pytest.raises(ConfigError, match="changes --grpo-clip-eps 0.2 -> 0.3"):
        resumed_config(again, tmp_path, {"grpo_clip_eps"}, table)

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from areno_core.config import (
    OPTION_SECTIONS,
    RunConfig,
    build_config,
    check_consistency,
    default_of,
    dump_yaml,
    iter_options,
    load_yaml_options,
)
from areno_core.errors import ConfigError
from areno_core.registry import get_registry

SEED_CLI = Path(__file__).resolve().parents[2] / "shared" / "seeds" / "001_5a8bc98a67bad380.txt"

# Every flag of the reference CLI, with its documented default (None: no default stated).
REFERENCE_DEFAULTS = {
    "ckpt": None, "dataset_path": None, "dataset_loader_fn": None, "algo": "gspo",
    "epochs": 10, "max_steps": None, "batch_size": 32, "n_samples": 8,
    "max_running_prompts": None, "max_prompt_tokens": 1024, "max_new_tokens": 3071,
    "max_context_len": None, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "greedy": False,
    "eager_decode": False, "drop_rollout_state": False, "attn_backend": "flash",
    "disable_thinking": False, "agent_fn": None, "agent_timeout_s": 300.0,
    "train_tool_results": False, "reward_fn_path": None, "reward_ckpt": None,
    "tune_params": False, "mem_frac": 0.9, "tune_max_samples": 256, "mini_bs": 16,
    "gradient_accumulation_steps": None, "activation_checkpointing": True, "lr": 1.0e-6,
    "min_lr": 1.0e-7, "lr_decay_steps": 1000, "lr_decay_style": "cosine", "adam_beta1": 0.9,
    "adam_beta2": 0.999, "adam_8bit": False, "weight_decay": 1.0e-2, "grad_clip_norm": 1.0,
    "ref_ckpt": None, "critic_ckpt": None, "critic_lr": 1.0e-5, "critic_warmup_steps": 20,
    "gspo_clip_eps": 3.0e-4, "grpo_clip_eps": 0.2, "dpo_beta": 0.1, "use_kl_loss": True,
    "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "clip_eps": 0.2, "clip_ratio_c": 3.0,
    "value_clip_eps": 0.5, "value_loss_coef": 0.5, "gamma": 1.0, "lam": 0.95,
    "save_path": None, "save_interval": 100, "metrics_log_dir": None,
}  # fmt: skip


@pytest.mark.usefixtures("installed_plugins_only")
def test_every_reference_flag_is_an_option_with_its_default():
    table = get_registry().options
    for name, default in REFERENCE_DEFAULTS.items():
        assert name in table, name
        assert table.default(name) == default, name


@pytest.mark.usefixtures("installed_plugins_only")
def test_reference_algorithm_flags_are_declared_by_areno_algos_not_the_core():
    table = get_registry().options
    core = set(OPTION_SECTIONS)
    for name in ("gspo_clip_eps", "grpo_clip_eps", "dpo_beta", "use_kl_loss", "gamma", "lam"):
        assert name not in core, name
        assert {o.distribution for o in table.owners(name)} == {"areno-algos"}, name
    assert {o.name for o in table.owners("clip_eps")} == {"rloo", "ppo"}


def test_reference_flags_list_matches_seed_document():
    text = SEED_CLI.read_text()
    # A flag declaration is followed by its type, by "/ --no-x", or directly by its help.
    declared = r"--([a-z0-9-]+)(?: (?:TEXT|INTEGER|FLOAT|\[)| / --no-[a-z-]+|(?=[A-Z]))"
    flags = {f.replace("-", "_") for f in re.findall(declared, text)}
    assert len(flags) == 61
    assert flags == set(REFERENCE_DEFAULTS) | {"world_size", "tp_size"}  # machine defaults


def test_every_option_has_help_text():
    for _, field in iter_options():
        assert len(field.metadata["help"]) > 10, field.name


def test_build_config_flat_options_land_in_their_sections():
    cfg = build_config({"lr": 3e-5, "n-samples": 4, "--save-path": "/tmp/x"})
    assert cfg.train.lr == 3e-5 and cfg.rollout.n_samples == 4
    assert cfg.checkpoint.save_path == "/tmp/x"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "--batch-size must be positive, got 0"),
        ({"mini_bs": -2}, "--mini-bs must be positive, got -2"),
        ({"top_p": 1.5}, r"--top-p must be in \(0, 1\], got 1.5"),
        ({"top_k": 0}, "--top-k must be -1 \\(disabled\\) or a positive integer, got 0"),
        (
            {"attn_backend": "xformers"},
            "--attn-backend must be one of flash, native, got 'xformers'",
        ),
        ({"lr_decay_style": "step"}, "--lr-decay-style must be one of cosine, linear, constant"),
        ({"epochs": "many"}, "--epochs expects int, got 'many'"),
        ({"batch_size": 2.5}, "--batch-size expects int, got 2.5"),
        ({"greedy": "yes"}, "--greedy expects bool, got 'yes'"),
        ({"algo": None}, r"--algo cannot be empty \(null\)"),
        ({"learning_rate": 1}, "unknown option 'learning_rate'"),
        ({"n_sample": 1}, "unknown option 'n_sample'. Did you mean n-samples"),
    ],
)
def test_build_config_bad_value_names_option_and_expectation(options, message):
    with pytest.raises(ConfigError, match=message):
        build_config(options)


@pytest.mark.parametrize(
    ("options", "explicit", "message"),
    [
        ({"world_size": 6, "tp_size": 4}, set(), "--world-size 6 is not divisible by --tp-size 4"),
        ({"lr": 1e-6, "min_lr": 1e-5}, set(), "--min-lr 1e-05 is larger than --lr 1e-06"),
        (
            {"greedy": True, "temperature": 0.7},
            {"greedy", "temperature"},
            "--greedy contradicts --temperature",
        ),
        ({"train_tool_results": True}, {"train_tool_results"}, "--train-tool-results needs"),
        ({"max_context_len": 100}, {"max_context_len"}, "--max-context-len applies to agentic"),
    ],
)  # fmt: skip
def test_check_consistency_contradictions_raise(options, explicit, message):
    with pytest.raises(ConfigError, match=message):
        check_consistency(build_config(options), explicit=explicit)


def test_yaml_config_flat_and_nested_load(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 2.0e-5\nrollout:\n  n_samples: 3\n  max-new-tokens: 12\n")
    assert load_yaml_options(path) == {"lr": 2e-5, "n_samples": 3, "max_new_tokens": 12}


def test_yaml_config_unknown_key_is_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-5\nbatchsize: 4\n")
    with pytest.raises(ConfigError, match="unknown option 'batchsize'. Did you mean batch-size"):
        load_yaml_options(path)
    path.write_text("train:\n  n_samples: 4\n")
    with pytest.raises(ConfigError, match="'n_samples' does not belong in section 'train'; it is"):
        load_yaml_options(path)
    path.write_text("train:\n  n_sample: 4\n")
    with pytest.raises(ConfigError, match="section 'train': unknown option 'n_sample'"):
        load_yaml_options(path)


def test_yaml_config_not_a_mapping_is_rejected(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping of options, got list"):
        load_yaml_options(path)


def test_dumped_config_loads_back_identically(tmp_path):
    cfg = build_config({"lr": 5e-5, "algo": "grpo", "save_path": "out"})
    dump_yaml(cfg.to_dict(), tmp_path / "config.yaml")
    again = build_config(load_yaml_options(tmp_path / "config.yaml"))
    assert attrs.asdict(again.train) == attrs.asdict(cfg.train)
    assert again.flat() == cfg.flat()


def test_flat_attribute_access_reads_section_fields():
    cfg = build_config({"mini_bs": 3})
    assert cfg.mini_bs == 3 == cfg.train.mini_bs
    with pytest.raises(AttributeError):
        _ = cfg.not_an_option


def test_build_config_without_plugins_refuses_plugin_options():
    with pytest.raises(ConfigError, match="unknown option 'grpo_clip_eps'"):
        build_config({"grpo_clip_eps": 0.3})


@pytest.mark.usefixtures("installed_plugins_only")
def test_build_config_with_table_keeps_plugin_options_typed():
    table = get_registry().options
    cfg = build_config({"grpo-clip-eps": 1, "use_kl_loss": False, "lr": 1e-5}, table=table)
    assert cfg.plugin == {"grpo_clip_eps": 1.0, "use_kl_loss": False}
    assert isinstance(cfg.plugin["grpo_clip_eps"], float)
    with pytest.raises(ConfigError, match="--use-kl-loss expects bool, got 'no'"):
        build_config({"use_kl_loss": "no"}, table=table)


@pytest.mark.usefixtures("installed_plugins_only")
def test_yaml_plugin_sections_load_and_misplaced_keys_are_named(tmp_path):
    table = get_registry().options
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  dpo_beta: 0.2\nrollout_engine:\n  prefill_batch_tokens: 64\n")
    assert load_yaml_options(path, table) == {"dpo_beta": 0.2, "prefill_batch_tokens": 64}
    path.write_text("algorithm:\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match="'lr' does not belong in section 'algorithm'"):
        load_yaml_options(path, table)


def test_default_of_reads_the_field_defaults():
    assert default_of("lr") == RunConfig().lr == 1e-6
    assert default_of("algo") == "gspo"
    assert default_of("activation_checkpointing") is True

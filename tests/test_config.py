from __future__ import annotations

import json
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

# Every flag of the reference CLI specification, with its section and documented default (None:
# no default stated), kept as data beside the tests.
REFERENCE = json.loads((Path(__file__).parent / "reference_cli_flags.json").read_text())
MACHINE_DEPENDENT = {f[2:].replace("-", "_") for f in REFERENCE["machine_dependent"]}
# Defaults areno chose differently from the reference, each for a measured reason:
# --activation-checkpointing is auto (on only when the activations need it): always on cost
# 1.6x the training CPU time of small models (docs/performance.md).
CHANGED_DEFAULTS = {"activation_checkpointing": None}
REFERENCE_FLAGS = {row["flag"][2:].replace("-", "_"): row for row in REFERENCE["flags"]}


def test_reference_flag_list_is_complete():
    assert len(REFERENCE_FLAGS) == 61
    assert all(row["flag"].startswith("--") for row in REFERENCE["flags"])
    assert MACHINE_DEPENDENT == {"world_size", "tp_size"} <= set(REFERENCE_FLAGS)


@pytest.mark.usefixtures("installed_plugins_only")
def test_every_reference_flag_is_an_option_in_its_section_with_its_default():
    """Core flags sit in their reference section; the algorithm flags the reference lists under
    Train are declared by areno-algos, whose sections --help and docs/cli.md show after Train."""
    table = get_registry().options
    for name, row in REFERENCE_FLAGS.items():
        assert name in table, name
        if table.is_core(name):
            assert OPTION_SECTIONS[name] == row["section"], name
        else:
            assert row["section"] == "train", name
            assert {o.kind for o in table.owners(name)} == {"algorithm"}, name
        if name in CHANGED_DEFAULTS:
            assert table.default(name) == CHANGED_DEFAULTS[name], name
        elif name not in MACHINE_DEPENDENT:  # ours default to one device
            assert table.default(name) == row["default"], name


@pytest.mark.usefixtures("installed_plugins_only")
def test_reference_algorithm_flags_are_declared_by_areno_algos_not_the_core():
    table = get_registry().options
    core = set(OPTION_SECTIONS)
    for name in ("gspo_clip_eps", "grpo_clip_eps", "dpo_beta", "use_kl_loss", "gamma", "lam"):
        assert name not in core, name
        assert {o.distribution for o in table.owners(name)} == {"areno-algos"}, name
    assert {o.name for o in table.owners("clip_eps")} == {"rloo", "ppo"}


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
        ({"learning_rate": 1}, r"unknown option 'learning_rate'. Did you mean lr\?"),
        ({"num_generations": 4}, r"unknown option 'num_generations'. Did you mean n-samples\?"),
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
    assert default_of("activation_checkpointing") is None  # auto (areno_core.train.checkpointing)

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from areno_core.config import SECTION_TITLES, iter_options
from areno_core.testing import areno_exit_code


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = areno_exit_code(*argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_train_help_lists_every_option_in_its_section_in_order(capsys, toy_registry):
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0
    titles = [SECTION_TITLES[s] for s in SECTION_TITLES]
    positions = [out.index(f"\n{t}:\n") for t in titles]
    assert positions == sorted(positions)
    bounds = dict(zip(SECTION_TITLES, [*positions[1:], len(out)], strict=True))
    starts = dict(zip(SECTION_TITLES, positions, strict=True))
    for section, field in iter_options():
        flag = "--" + field.name.replace("_", "-")
        hit = re.search(re.escape(flag) + r"[ /\n]", out[starts[section] : bounds[section]])
        assert hit, f"{flag} not under {section}"


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("--learning-rate", "'--lr'"),  # another tool's name: the alias table
        ("--learning_rate", "'--lr'"),
        ("--num-generations", "'--n-samples'"),
        ("--mini_bs", "'--mini-bs'"),  # the option, spelt with underscores
        ("--dry_run", "'--dry-run'"),  # the command's own options too
        ("--lrr", "'--lr'"),  # a typo: the closest spelling
    ],
)
def test_train_unknown_flag_suggests_what_the_config_path_suggests(capsys, typed, meant):
    code, _, err = run_cli(capsys, "train", typed, "1e-3")
    assert code == 2
    assert f"Error: No such option '{typed}'. Did you mean {meant}?" in err


def test_train_unknown_flag_far_from_any_option_has_no_suggestion(capsys):
    code, _, err = run_cli(capsys, "train", "--zzzzzz", "1")
    assert code == 2
    assert "Error: No such option '--zzzzzz'.\n" in err


def test_train_unknown_algo_lists_registered_ones(capsys, toy_registry):
    code, _, err = run_cli(
        capsys,
        "train",
        "--algo",
        "grpoo",
        "--ckpt",
        "random:qwen3-tiny",
        "--dataset-path",
        "x.jsonl",
    )
    assert code == 2
    assert "unknown algorithm 'grpoo'" in err and "Registered algorithms: toy" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "3", "--tp-size", "2"], "--world-size 3 is not divisible by --tp-size 2"),
        (["--batch-size", "0"], "--batch-size must be positive, got 0"),
        (["--mini-bs", "-1"], "--mini-bs must be positive, got -1"),
        (["--tune-params"], "--tune-params tunes rollout concurrency and the batch it feeds"),
        (
            ["--world-size", "2", "--adam-8bit"],
            "--world-size 2 --tp-size 1: the distributed backend cannot run this "
            "configuration: 8-bit Adam (--adam-8bit)",
        ),
        (["--greedy", "--top-k", "5"], "--greedy contradicts --top-k"),
        (["--reward-fn-path", "r.py"], "--reward-fn-path is for online RL algorithms"),
    ],
)
def test_train_bad_inputs_exit_2_with_clear_message(capsys, toy_registry, args, message):
    base = ["train", "--algo", "toy", "--ckpt", "random:qwen3-tiny", "--dataset-path", "d.jsonl"]
    code, _, err = run_cli(capsys, *base, *args)
    assert code == 2
    assert message in " ".join(err.split())
    assert "Traceback" not in err


def test_train_config_file_and_flags_precedence_in_dry_run(capsys, toy_registry, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "algo: toy\nckpt: random:qwen3-tiny\ndataset_path: a.jsonl\nlr: 2.0e-5\nmini_bs: 3\n"
    )
    code, out, err = run_cli(capsys, "train", "--config", str(cfg), "--mini-bs", "5", "--dry-run")
    assert code == 0, err
    resolved = yaml.safe_load(out)
    assert resolved["train"]["lr"] == 2e-5  # from the file
    assert resolved["train"]["mini_bs"] == 5  # flag wins
    assert resolved["basic"]["world_size"] == 1 and resolved["basic"]["tp_size"] == 1


def test_train_config_unknown_key_is_named(capsys, toy_registry, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("algo: toy\nlearning_rate: 1\n")
    code, _, err = run_cli(capsys, "train", "--config", str(cfg))
    assert code == 2 and "unknown option 'learning_rate'" in err


def test_train_missing_ckpt_is_reported(capsys, toy_registry):
    code, _, err = run_cli(capsys, "train", "--algo", "toy", "--dataset-path", "d.jsonl")
    assert code == 2 and "--ckpt is required" in err


def test_plugins_json_lists_plugin_and_registrations(capsys, toy_registry):
    code, out, _ = run_cli(capsys, "plugins", "--json")
    assert code == 0
    report = json.loads(out)
    by_dist = {p["distribution"]: p for p in report["plugins"]}
    assert set(by_dist) == {"areno-core", "toy-algo-pack"}
    assert by_dist["areno-core"]["registered"] == {
        "rollout_engines": ["native"],
        "backends": ["distributed", "local"],
        "metric_sinks": ["jsonl", "tensorboard"],
    }
    assert by_dist["areno-core"]["options"] == {
        "rollout engine native": [
            "prefill_batch_tokens",
            "lean_forward",
            "shared_prompt_cache",
            "prepacked_weights",
        ],
        "training backend distributed": ["dist_timeout_s", "fsdp_mixed_precision", "dp_replicate"],
        "training backend local": ["share_prefix", "packed_forward"],
    }
    plugin = by_dist["toy-algo-pack"]
    assert plugin["registered"] == {"algorithms": ["toy"], "rewards": ["always_one"]}
    assert plugin["options"] == {"algorithm toy": ["toy_beta"]}


def test_plugins_table_with_no_plugins_says_how_to_install(capsys, monkeypatch):
    from areno_core.registry import set_registry

    monkeypatch.setenv("ARENO_PLUGINS", "")
    set_registry(None)
    code, out, _ = run_cli(capsys, "plugins")
    set_registry(None)
    assert code == 0 and "pip install areno-algos" in out


def test_cli_subprocess_user_error_prints_no_traceback():
    env = {**os.environ, "ARENO_PLUGINS": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "areno_core.cli.main", "train", "--batch-size", "-4"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--batch-size must be positive, got -4" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_train_reuses_a_dumped_run_config(capsys, toy_registry, tmp_path):
    from areno_core.config import build_config, dump_yaml

    cfg = build_config(
        {"algo": "toy", "ckpt": "random:qwen3-tiny", "dataset_path": "a.jsonl", "lr": 3e-5}
    )
    dump_yaml(cfg.to_dict(), tmp_path / "config.yaml")
    code, out, err = run_cli(
        capsys, "train", "--config", str(tmp_path / "config.yaml"), "--dry-run"
    )
    assert code == 0, err
    assert yaml.safe_load(out)["train"]["lr"] == 3e-5

"""The published examples run and do what their docs say.

- ``examples/python_api.py`` exits 0 on CPU, its SFT losses fall step after step, its GRPO steps
  move the importance ratios away from 1, and an unsupported keyword is a TypeError;
- the example plugin pack's own test suite passes (it installs the pack through a real
  ``areno`` entry point and checks its loader, reward and recipe);
- every hook example in docs/plugins.md, installed as a plugin, registers what it says.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGINS_DOC = REPO / "docs" / "plugins.md"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def pack_suite() -> Iterator[subprocess.Popen[str]]:
    """The example plugin pack's own test suite, run by pytest from the pack's directory.

    Started once per module, in the background, so it overlaps with the other subprocess test.
    """
    env = _env()
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests"],
        cwd=REPO / "examples" / "plugin-pack",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


# -- examples/python_api.py -----------------------------------------------------------------


def test_python_api_example_cpu_run_prints_decreasing_losses(gsm8k_dir, tmp_path, pack_suite):
    # pack_suite is requested first so the pack's test run overlaps with this one.
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "python_api.py"),
            str(gsm8k_dir / "train.jsonl"),
            "--out",
            str(tmp_path / "metrics"),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    sft = [float(x) for x in re.findall(r"^sft step \d+ loss (\S+)$", out, re.M)]
    assert len(sft) == 6, out
    assert all(b < a for a, b in pairwise(sft)), f"SFT losses: {sft}"
    assert sft[0] == pytest.approx(5.59, abs=0.05)  # about log(vocabulary) for a random model
    grpo = re.findall(
        r"^grpo step (\d+) loss (\S+) reward (\S+) ratio \[(\S+), (\S+)\] "
        r"clip_fraction (\S+) optimizer_steps (\d+)$",
        out,
        re.M,
    )
    assert [int(g[0]) for g in grpo] == [7, 8], out
    for _, loss, reward, ratio_min, ratio_max, clip_fraction, opt_steps in grpo:
        assert math.isfinite(float(loss))
        assert 0.0 <= float(reward) <= 1.0
        assert int(opt_steps) == 2
        # The second optimizer step sees a moved policy: ratios leave 1 on both sides.
        assert float(ratio_min) < 0.99 and float(ratio_max) > 1.01
        assert 0.0 <= float(clip_fraction) <= 1.0
    assert re.search(r"^TypeError: .*unexpected keyword argument\(s\) dpo_beta", out, re.M)
    metrics = (tmp_path / "metrics" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 8


# -- examples/plugin-pack --------------------------------------------------------------------


def test_plugin_pack_own_tests_pass_and_register_reward_recipe(pack_suite):
    stdout, _ = pack_suite.communicate(timeout=300)
    assert pack_suite.returncode == 0, stdout
    assert "8 passed" in stdout
    for name in (
        "test_installed_pack_registers_loader_reward_and_recipe",
        "test_echo_reward_partial_prefix_scores_matched_fraction",
        "test_echo_recipe_resolves_defaults_explicit_flag_wins",
        "test_echo_recipe_trains_two_steps_logs_rewards",
    ):
        assert f"PASSED tests/test_pack.py::{name}" in stdout


# -- the hook examples of docs/plugins.md ----------------------------------------------------


def _hook_example(hook: str) -> str:
    """The example plugin (the code block with ``@hookimpl``) of a hook's section."""
    text = PLUGINS_DOC.read_text()
    section = text.split(f"\n### {hook}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    [example] = [b for b in blocks if "@hookimpl" in b]
    return example


@pytest.fixture
def doc_plugin(install_areno_plugin, monkeypatch):
    """Install one hook example from docs/plugins.md as the only entry-point plugin."""

    def install(hook: str):
        module = f"doc_example_{hook}"
        monkeypatch.setenv("ARENO_PLUGINS", f"doc-example-{hook.replace('_', '-')}")
        registry = install_areno_plugin(
            f"doc-example-{hook.replace('_', '-')}", module, _hook_example(hook)
        )
        assert registry.failures == []
        return registry, module

    return install


def test_doc_example_register_algorithms_trains_one_step(doc_plugin, gsm8k_dir):
    import json

    from areno_core.backend import LocalBackend, TrainableModel

    registry, module = doc_plugin("register_algorithms")
    assert registry.provided_by(module) == {"algorithms": ["sft_seqmean"]}
    with (gsm8k_dir / "train.jsonl").open() as f:
        raw = [json.loads(next(f)) for _ in range(4)]
    rows = [{"prompt": r["question"], "response": r["answer"]} for r in raw]
    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    result = LocalBackend(device="cpu").train(
        model, rows, algorithm="sft_seqmean", learning_rate=1e-3, mini_bs=2, max_new_tokens=32
    )
    assert result.metrics["train/nll_seq_mean"] == pytest.approx(result.metrics["train/loss"])
    assert 4.0 < result.metrics["train/loss"] < 7.0


def test_doc_example_register_dataset_loaders_drops_unanswered_rows(doc_plugin):
    registry, module = doc_plugin("register_dataset_loaders")
    assert registry.provided_by(module) == {"dataset_loaders": ["qa_pairs"]}
    loader = registry.get("dataset_loaders", "qa_pairs")
    assert loader({"q": "2+2?", "a": "4"}) == {"prompt": "2+2?", "response": "4"}
    assert loader({"q": "why?", "a": ""}) is None


def test_doc_example_register_rewards_scores_exact_answer(doc_plugin):
    from areno_core.types import RewardRecord

    registry, module = doc_plugin("register_rewards")
    assert registry.provided_by(module) == {"rewards": ["exact_answer"]}
    reward_fn = registry.get("rewards", "exact_answer")
    assert reward_fn(RewardRecord(prompt="p", completion=" 42\n", answer="42")) == 1.0
    assert reward_fn(RewardRecord(prompt="p", completion="41", answer="42")) == 0.0


def test_doc_example_register_agents_plays_every_task_through_endpoint(doc_plugin):
    from areno_core.agentic import collect_agentic_groups
    from areno_core.backend import TrainableModel
    from areno_core.contracts.engine import EngineOptions
    from areno_core.rewards import RewardScorer
    from areno_core.rollout.collect import prompt_item
    from areno_core.rollout.native import create_native_engine
    from areno_core.types import SamplingParams

    registry, module = doc_plugin("register_agents")
    assert registry.provided_by(module) == {"agents": ["single_turn"]}
    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    engine = create_native_engine(
        model.policy, model.tokenizer, EngineOptions(attn_backend="native")
    )
    items = [prompt_item(i, {"prompt": p}) for i, p in enumerate(["Say hi.", "Count to 3."])]
    engine.start_session()
    try:
        groups, metrics = collect_agentic_groups(
            items,
            agent_fn=registry.get("agents", "single_turn"),
            engine=engine,
            tokenizer=model.tokenizer,
            sampling=SamplingParams(max_new_tokens=8),
            n_samples=2,
            scorer=RewardScorer(lambda record: 1.0),
            timeout_s=60,
        )
    finally:
        engine.end_session()
    assert [len(g.trajectories) for g in groups] == [2, 2]
    assert metrics["rollout/agent_requests"] == 4.0
    assert metrics["rollout/agent_errors"] == 0.0
    for group in groups:
        for trajectory in group.trajectories:
            assert 1 <= trajectory.num_action_tokens <= 8


def test_doc_example_register_recipes_fills_gspo_options(doc_plugin):
    registry, module = doc_plugin("register_recipes")
    assert registry.provided_by(module) == {"recipes": ["mathx/gsm8k-tiny"]}
    options = registry.recipe("mathx/gsm8k-tiny").options_for("gspo")
    assert options["loss_agg"] == "seq-mean-token-mean"
    assert options["dataset_loader_fn"] == "gsm8k"
    assert options["ckpt"] == "random:qwen3-tiny"


def test_doc_example_register_rollout_engines_builds_copy_engine(doc_plugin):
    import torch

    from areno_core.contracts.engine import EngineOptions
    from areno_core.models.loading import load_model_and_tokenizer
    from areno_core.types import SamplingParams

    registry, module = doc_plugin("register_rollout_engines")
    assert registry.provided_by(module) == {"rollout_engines": ["copy"]}
    spec = registry.engine("copy")
    assert registry.options.owners("copy_prefill_tokens")[0].name == "copy"
    model, tokenizer = load_model_and_tokenizer("random:qwen3-tiny", device="cpu")
    options = EngineOptions(attn_backend="native", max_running=4)
    engine = spec.create(model, tokenizer, options, spec.make_config({"copy_prefill_tokens": 64}))
    assert (engine.config.prefill_batch_tokens, engine.options.max_running) == (64, 4)
    assert engine.model is not model  # its own copy of the weights
    sampling = SamplingParams(max_new_tokens=4, greedy=True)
    before = engine.generate([[5, 6, 7]], sampling)[0][0].token_ids
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param))
    assert engine.generate([[5, 6, 7]], sampling)[0][0].token_ids == before  # stale copy
    engine.sync_weights(model, version=1)
    fresh = spec.create(model, tokenizer, options).generate([[5, 6, 7]], sampling)
    synced = engine.generate([[5, 6, 7]], sampling)[0][0]
    assert synced.token_ids == fresh[0][0].token_ids and synced.policy_version == 1


def test_doc_example_register_backends_trains_one_step(doc_plugin):
    from areno_algos.sft import SPEC as SFT

    from areno_core.backend import LocalBackend, TrainableModel
    from areno_core.config import build_config

    registry, module = doc_plugin("register_backends")
    assert registry.provided_by(module) == {"backends": ["plain"]}
    spec = registry.backend("plain")
    assert spec.check(build_config({"world_size": 2})) == "one device only"
    backend = spec.factory(build_config({}), spec.make_config({}), registry)
    assert isinstance(backend, LocalBackend) and backend.share_prefix is False
    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    rows = [{"prompt": "2+2=", "response": "4"}, {"prompt": "3+3=", "response": "6"}]
    result = backend.train(model, rows, algorithm=SFT, learning_rate=1e-3, mini_bs=2)
    assert result.step == 1 and model.optimizer_steps == 1
    assert 3.0 < result.metrics["train/loss"] < 7.0

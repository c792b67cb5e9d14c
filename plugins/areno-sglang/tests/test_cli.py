"""``areno`` with the installed areno-sglang plugin: listing, checks before any model loads,
and GRPO trained end to end through the remote mode against a protocol server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from areno_sglang import config as config_module
from areno_sglang.protocol_server import ProtocolServer

from areno_core.cli.main import main
from areno_core.testing import run_areno
from areno_core.train.checkpoint import read_weights

pytestmark = pytest.mark.usefixtures("installed_plugins_only")

RL_ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
REWARD = "def reward_fn(record):\n    return float(len(record.completion) % 2)\n"


def _exit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


@pytest.fixture
def rl_files(tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RL_ROWS))
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    return data, reward


def test_areno_plugins_lists_the_engine_and_its_options(capsys):
    run_areno("plugins", "--json")
    report = json.loads(capsys.readouterr().out)
    [plugin] = [p for p in report["plugins"] if p["distribution"] == "areno-sglang"]
    assert plugin["registered"] == {"rollout_engines": ["sglang"]}
    options = plugin["options"]["rollout engine sglang"]
    assert {"sglang_mode", "sglang_url", "sglang_weight_sync", "sglang_timeout_s"} <= set(options)
    run_areno("train", "--help")
    help_text = capsys.readouterr().out
    assert "Rollout engine sglang (areno-sglang):" in help_text
    assert "--sglang-url URL[,URL...]" in help_text


def test_colocated_mode_without_sglang_fails_before_loading_with_the_install_command(
    capsys, monkeypatch, rl_files, tmp_path
):
    monkeypatch.setattr(config_module, "sglang_installed", lambda: False)
    data, reward = rl_files
    out = tmp_path / "run"
    code, _, err = _exit(
        capsys, "train", "--algo", "grpo", "--rollout-engine", "sglang",
        "--ckpt", str(tmp_path / "no-such-model"), "--dataset-path", str(data),
        "--reward-fn-path", str(reward), "--save-path", str(out),
    )  # fmt: skip
    assert code == 2
    # the engine's check ran first: the missing checkpoint was never opened
    assert "--rollout-engine sglang: the sglang package is not installed" in err
    assert "pip install areno-sglang" in err
    assert "no-such-model" not in err
    assert not out.exists()


def test_remote_mode_without_a_url_is_a_config_error(capsys, rl_files, tmp_path):
    data, reward = rl_files
    code, _, err = _exit(
        capsys, "train", "--algo", "grpo", "--rollout-engine", "sglang", "--sglang-mode",
        "remote", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(data),
        "--reward-fn-path", str(reward),
    )  # fmt: skip
    assert code == 2
    assert "--sglang-mode remote needs --sglang-url" in err


@pytest.mark.parametrize(
    ("algo", "says"),
    [
        ("grpo", "this run samples with --rollout-engine native; add --rollout-engine sglang or"),
        ("sft", "this run (--algo sft) samples nothing; drop --sglang-url"),
    ],
)
def test_sglang_url_without_the_sglang_engine_is_an_error(capsys, rl_files, tmp_path, algo, says):
    # It used to warn and train on the native engine: the user's server sat unused.
    data, reward = rl_files
    run = tmp_path / "run"
    code, _, err = _exit(
        capsys, "train", "--algo", algo, "--sglang-url", "http://127.0.0.1:30000",
        "--ckpt", "random:qwen3-tiny", "--dataset-path", str(data), "--reward-fn-path",
        str(reward), "--save-path", str(run),
    )  # fmt: skip
    assert code == 2
    assert "--sglang-url is an option of rollout engine sglang (areno-sglang), but " + says in err
    assert not run.exists()


def test_grpo_trains_end_to_end_through_a_remote_server_with_weights_pushed_every_step(
    rl_files, tmp_path
):
    from areno_core.models.loading import load_model

    torch.manual_seed(123)  # the server starts from other weights than the run's policy
    server = ProtocolServer(load_model("random:qwen3-tiny")).start()
    data, reward = rl_files
    run = tmp_path / "run"
    try:
        run_areno(
            "train", "--algo", "grpo", "--ckpt", "random:qwen3-tiny", "--dataset-path", str(data),
            "--reward-fn-path", str(reward), "--rollout-engine", "sglang",
            "--sglang-url", server.url, "--sglang-weights-dir", str(tmp_path / "pushed"),
            "--batch-size", "2", "--n-samples", "4", "--mini-bs", "4",
            "--gradient-accumulation-steps", "1", "--max-new-tokens", "4", "--max-steps", "3",
            "--lr", "1e-2", "--save-path", str(run), "--no-activation-checkpointing",
        )  # fmt: skip
    finally:
        server.stop()

    rows = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    # 2 prompts x 4 samples in microbatches of 4: two optimizer steps per trainer step
    assert [r["train/optimizer_steps"] for r in rows] == [2.0, 2.0, 2.0]
    assert [r["rollout/policy_version"] for r in rows] == [0.0, 2.0, 4.0]
    assert [r["rollout/policy_lag"] for r in rows] == [0.0, 0.0, 0.0]
    assert all(r["rollout/samples"] == 8.0 for r in rows)
    # the weights went to the server before the first rollout and after every step, each
    # push tagged with its version, each rollout batch sampled at the version just pushed
    pushes = [b["weight_version"] for _, p, b in server.calls if p == "/update_weights_from_disk"]
    assert pushes == ["0", "2", "4", "6"]
    versions = []
    for _, path, body in server.calls:
        if path == "/update_weights_from_disk":
            versions.append(body["weight_version"])
        elif path == "/generate":
            assert len(body["input_ids"]) == 8  # one batch: 2 prompts x 4 samples
            assert versions and versions[-1] in ("0", "2", "4")
    assert server.weight_version == "6"
    final = read_weights(run / "step_3")
    served = server.model.state_dict()
    for name, tensor in final.items():
        torch.testing.assert_close(served[name], tensor, rtol=0.0, atol=0.0)
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["rollout_engine"]["sglang_url"] == server.url
    # the engine removes the weights it wrote once the run is over
    assert list((tmp_path / "pushed").iterdir()) == []


def test_agentic_recipe_trains_through_the_endpoint_on_top_of_a_remote_server(tmp_path):
    # The OpenAI-compatible agent endpoint talks to the engine protocol only, so the
    # tic-tac-toe agent plays through it unchanged while the turns are sampled remotely.
    from areno_recipes_agentic.recipes import TICTACTOE_CPU

    from areno_core.models.loading import load_model
    from areno_core.recipe import resolve_resource

    # The server serves what the recipe trains: its shipped warm start.
    server = ProtocolServer(load_model(resolve_resource(TICTACTOE_CPU.checkpoint))).start()
    run = tmp_path / "run"
    try:
        run_areno(
            "train", "--recipe", "agentic/tictactoe-cpu", "--algo", "grpo", "--max-steps", "1",
            # 2 positions x 2 samples instead of the recipe's 16 x 8: the path is the same
            "--batch-size", "2", "--n-samples", "2", "--mini-bs", "4",
            "--rollout-engine", "sglang", "--sglang-url", server.url, "--save-path", str(run),
        )  # fmt: skip
    finally:
        server.stop()
    [step] = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    assert step["rollout/agent_requests"] >= step["rollout/samples"] == 4
    assert step["rollout/agent_errors"] == 0
    assert step["rollout/policy_version"] == 0.0
    generated = sum(len(b["input_ids"]) for _, p, b in server.calls if p == "/generate")
    assert generated == step["rollout/agent_requests"]
    # a remote server may be shared: the first push runs between pause and continue
    assert server.routes("POST")[:4] == [
        "/pause_generation",
        "/update_weights_from_disk",
        "/flush_cache",
        "/continue_generation",
    ]

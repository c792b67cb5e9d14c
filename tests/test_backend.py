from __future__ import annotations

import pytest
import torch

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

ROWS = [
    {"prompt": "2+2=", "response": "4"},
    {"prompt": "3+3=", "response": "6"},
    {"prompt": "1+4=", "response": "5"},
    {"prompt": "7+1=", "response": "8"},
]


pytestmark = pytest.mark.usefixtures("installed_plugins_only")


@pytest.fixture
def model() -> TrainableModel:
    return TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)


def test_train_unknown_keyword_is_type_error_naming_valid_options(model):
    with pytest.raises(
        TypeError, match="unexpected keyword argument\\(s\\) grpo_clip_eps for algorithm 'sft'"
    ):
        LocalBackend().train(model, ROWS, algorithm="sft", grpo_clip_eps=0.3)
    with pytest.raises(TypeError, match="not_an_arg for algorithm 'grpo'; its options are: "):
        LocalBackend().train(model, [], algorithm="grpo", not_an_arg=1)


def test_train_sft_steps_lower_loss_and_count_steps(model):
    backend = LocalBackend()
    losses = []
    for _ in range(8):
        result = backend.train(model, ROWS, algorithm="sft", learning_rate=1e-2, mini_bs=2)
        losses.append(result.metrics["train/loss"])
    assert result.step == 8 == model.step
    assert model.optimizer_steps == 8
    assert losses[-1] < losses[0]
    assert result.metrics["train/target_tokens"] > 0


def test_train_changed_optimizer_settings_are_refused(model):
    backend = LocalBackend()
    backend.train(model, ROWS, algorithm="sft", learning_rate=1e-3)
    with pytest.raises(ValueError, match="learning_rate changed"):
        backend.train(model, ROWS, algorithm="sft", learning_rate=5e-3)


def test_train_accumulation_one_gives_an_optimizer_step_per_microbatch(model):
    result = LocalBackend().train(
        model, ROWS, algorithm="sft", mini_bs=1, gradient_accumulation_steps=1
    )
    assert result.metrics["train/optimizer_steps"] == 4.0
    assert model.optimizer_steps == 4


def test_train_online_algorithm_rejects_rows_and_sft_rejects_groups(model):
    group = TrajectoryGroup(
        item=PromptItem(index=0, row={}, prompt="x"),
        trajectories=[Trajectory(input_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                                 rollout_logprobs=[0.0, -1.0, -1.0], reward=1.0)],
    )  # fmt: skip
    with pytest.raises(TypeError, match="trains on TrajectoryGroup objects, got dict"):
        LocalBackend().train(model, ROWS, algorithm="grpo")
    with pytest.raises(TypeError, match="trains on dataset rows, not trajectories"):
        LocalBackend().train(model, [group], algorithm="sft")


def test_log_writes_explicit_metrics_and_reward_stats(tmp_path):
    from areno_core.metrics.logger import read_jsonl

    model = TrainableModel.from_ckpt("random:qwen3-tiny", metrics_dir=str(tmp_path))
    group = TrajectoryGroup(
        item=PromptItem(index=0, row={}, prompt="x"),
        trajectories=[
            Trajectory(input_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -1.0], reward=r)
            for r in (0.0, 1.0)
        ],
    )
    logged = model.log([group], metrics={"train/loss": 2.5}, step=3)
    model.close()
    assert logged["rollout/reward_mean"] == 0.5 and logged["rollout/reward_max"] == 1.0
    [line] = read_jsonl(tmp_path)
    assert line["step"] == 3 and line["train/loss"] == 2.5
    torch.testing.assert_close(line["rollout/reward_std"], 0.5)


def test_metrics_are_written_when_a_model_is_dropped_without_close(tmp_path):
    """A script that never calls close() still gets its TensorBoard points (the writer buffers
    them for seconds), and no writer thread outlives the model."""
    import gc
    import threading

    from areno_core.metrics.logger import read_scalars

    def writer_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if type(t).__name__ == "_AsyncWriterThread"}

    others = writer_threads()  # open elsewhere in this process: not this model's
    model = TrainableModel.from_ckpt("random:qwen3-tiny", metrics_dir=str(tmp_path))
    model.log(metrics={"train/loss": 2.5}, step=7)
    writers = writer_threads() - others
    assert writers  # this model's TensorBoard sink runs a writer thread
    del model
    gc.collect()
    assert read_scalars(tmp_path)["train/loss"] == [(7, 2.5)]
    assert not [t for t in writers if t.is_alive()]
    # close() twice is harmless
    again = TrainableModel.from_ckpt("random:qwen3-tiny", metrics_dir=str(tmp_path / "b"))
    again.close()
    again.close()


EVAL_ROWS = [
    {"prompt": "12+30=", "response": "42"},
    {"prompt": "5+5=", "response": "10, that is ten"},
    {"prompt": "What is 9 times 9?", "response": "81"},
]


def test_evaluate_sft_loss_is_token_mean_nll_and_changes_nothing(model):
    from areno_core.train.featurize import sft_trajectories

    backend = LocalBackend()
    weights = {k: v.clone() for k, v in model.policy.state_dict().items()}
    rng = model.generator.get_state().clone()
    model.policy.train()
    metrics = backend.evaluate(model, EVAL_ROWS, algorithm="sft", mini_bs=1)
    # By hand: -log p of every response token, averaged over all of them.
    trajs, _ = sft_trajectories(
        EVAL_ROWS, model.tokenizer, max_prompt_tokens=1024, max_new_tokens=3071
    )
    nll, count = 0.0, 0
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.input_ids])
            logp = torch.log_softmax(model.policy(ids).logits.float(), -1)[0]
            for pos in range(1, len(t.input_ids)):
                if t.loss_mask[pos]:
                    nll -= float(logp[pos - 1, t.input_ids[pos]])
                    count += 1
    assert count > 6
    assert metrics["eval/loss"] == pytest.approx(nll / count, rel=1e-5)
    assert metrics["eval/nll"] == pytest.approx(nll / count, rel=1e-5)
    # Microbatching does not change the number; weights, optimizer and RNG are untouched.
    assert backend.evaluate(model, EVAL_ROWS, algorithm="sft", mini_bs=16)[
        "eval/loss"
    ] == pytest.approx(metrics["eval/loss"], rel=1e-5)
    for key, value in model.policy.state_dict().items():
        assert torch.equal(value, weights[key]), key
    assert torch.equal(model.generator.get_state(), rng)
    assert model.optimizer is None and model.step == 0
    assert model.policy.training  # train mode is restored after evaluating in eval mode


def test_evaluate_dpo_reports_preference_statistics(model):
    pairs = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "five"},
        {"prompt": "3+3=", "chosen": "6", "rejected": "no idea"},
    ]
    metrics = LocalBackend().evaluate(model, pairs, algorithm="dpo", mini_bs=2, dpo_beta=0.1)
    # Policy and reference are the same weights before training: margin 0, loss log 2.
    assert metrics["eval/rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["eval/dpo_loss"] == pytest.approx(0.693147, rel=1e-4)
    assert metrics["eval/loss"] == pytest.approx(0.693147, rel=1e-4)
    assert metrics["eval/rewards/accuracy"] == 0.0  # ties are not correct
    assert metrics["eval/skipped_rows"] == 0.0


def test_evaluate_rows_with_prompts_over_the_limit_are_counted_as_skipped(model):
    rows = [
        *EVAL_ROWS,
        {"prompt": "x" * 64, "response": "y"},
        {"prompt": "z" * 80, "response": "w"},
    ]
    full = LocalBackend().evaluate(model, EVAL_ROWS, algorithm="sft", mini_bs=4)
    metrics = LocalBackend().evaluate(model, rows, algorithm="sft", mini_bs=4, max_prompt_tokens=40)
    assert metrics["eval/skipped_rows"] == 2.0
    assert metrics["eval/loss"] == pytest.approx(full["eval/loss"], rel=1e-6)  # over the rest
    nothing = LocalBackend().evaluate(model, rows[-2:], algorithm="sft", max_prompt_tokens=40)
    assert nothing == {"eval/skipped_rows": 2.0}


def test_evaluate_online_algorithm_is_refused(model):
    with pytest.raises(ValueError, match="'grpo' is online RL"):
        LocalBackend().evaluate(model, EVAL_ROWS, algorithm="grpo")


# -- the backend contract ----------------------------------------------------------------------

# LocalBackend.train keyword -> the areno train option it mirrors.
API_OPTIONS = {
    "algorithm": "algo",
    "learning_rate": "lr",
    "min_lr": "min_lr",
    "lr_decay_steps": "lr_decay_steps",
    "lr_decay_style": "lr_decay_style",
    "weight_decay": "weight_decay",
    "adam_8bit": "adam_8bit",
    "grad_clip_norm": "grad_clip_norm",
    "mini_bs": "mini_bs",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "activation_checkpointing": "activation_checkpointing",
    "temperature": "temperature",
    "max_prompt_tokens": "max_prompt_tokens",
    "max_new_tokens": "max_new_tokens",
    "disable_thinking": "disable_thinking",
    "critic_lr": "critic_lr",
    "critic_warmup_steps": "critic_warmup_steps",
    "proximal_logprobs": "proximal_logprobs",
}


def test_train_defaults_are_the_cli_defaults():
    import inspect

    from areno_core.config import RunConfig

    params = inspect.signature(LocalBackend.train).parameters
    cli = RunConfig()
    for keyword, option in API_OPTIONS.items():
        assert params[keyword].default == getattr(cli, option), keyword
    assert params["adam_betas"].default == (cli.adam_beta1, cli.adam_beta2)
    named = {p for p in params if p not in ("self", "model", "data", "algorithm_options")}
    assert named == {*API_OPTIONS, "adam_betas"}


def test_local_backend_meets_the_training_backend_protocol():
    from areno_core.backend import TrainingBackend

    assert isinstance(LocalBackend(device="cpu"), TrainingBackend)


def test_train_uses_its_own_registry_or_a_spec_object(model):
    from areno_algos.sft import SPEC as SFT

    from areno_core.errors import ConfigError

    class NoAlgorithms:
        def algorithm(self, name):
            raise ConfigError(f"unknown algorithm {name!r} in this registry")

    backend = LocalBackend(device="cpu", registry=NoAlgorithms())  # type: ignore[arg-type]
    rows = [{"prompt": "1+1=", "response": "2"}]
    with pytest.raises(ConfigError, match="unknown algorithm 'sft' in this registry"):
        backend.train(model, rows, algorithm="sft")
    result = backend.train(model, rows, algorithm=SFT, learning_rate=1e-3)
    assert result.step == 1


def test_save_and_load_checkpoint_round_trip_model_state(model, tmp_path):
    from areno_algos.sft import SPEC as SFT

    backend = LocalBackend(device="cpu")
    rows = [{"prompt": "1+1=", "response": "2"}, {"prompt": "2+2=", "response": "4"}]
    backend.train(model, rows, algorithm=SFT, learning_rate=1e-3, mini_bs=1,
                  gradient_accumulation_steps=1)  # fmt: skip
    path = backend.save_checkpoint(model, tmp_path, trainer_state={"data": {"x": 1}}, config={})
    assert path.name == "step_1" and model.optimizer_steps == 2
    weights = {k: v.clone() for k, v in model.policy.state_dict().items()}
    backend.train(model, rows, algorithm=SFT, learning_rate=1e-3)
    fresh = TrainableModel.from_ckpt("random:qwen3-tiny", seed=5)
    backend.setup(fresh, SFT, learning_rate=1e-3)
    state = backend.load_checkpoint(fresh, path)
    assert state["data"] == {"x": 1}
    assert (fresh.step, fresh.optimizer_steps) == (1, 2)
    for key, value in fresh.policy.state_dict().items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0)


def test_train_multi_message_reply_error_names_the_row(model):
    from areno_core.errors import DatasetError

    user = {"role": "user", "content": "Sure?"}
    pairs = [
        {"prompt": "2+2=", "chosen": "4", "rejected": "five"},
        {"prompt": "3+3=", "chosen": [{"role": "assistant", "content": "6"}, user],
         "rejected": "no idea"},
    ]  # fmt: skip
    with pytest.raises(DatasetError, match=r"^row 1: a trained reply \(an sft response, a dpo"):
        LocalBackend().train(model, pairs, algorithm="dpo", mini_bs=2)
    assert model.step == 0


def _record_cudnn_flag_at_each_sdpa_call(monkeypatch) -> list[bool]:
    """Pretend the model is on a GPU as far as the cuDNN switch goes, and record the flag at
    every SDPA call (forward, and the ones checkpointing runs again in the backward)."""
    from areno_core.accel import attention
    from areno_core.train import local, update

    seen: list[bool] = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    for module in (local, update):
        monkeypatch.setattr(
            module, "sdpa_without_cudnn", lambda device: attention.sdpa_without_cudnn("cuda")
        )
    return seen


@pytest.mark.parametrize("packed", [False, True])
def test_train_keeps_cudnn_attention_off_in_every_forward_and_backward(monkeypatch, packed):
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        seen = _record_cudnn_flag_at_each_sdpa_call(monkeypatch)
        model = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)
        backend = LocalBackend(packed_forward=packed)
        backend.train(model, ROWS, algorithm="sft", mini_bs=2, activation_checkpointing=True)
        assert seen and not any(seen)
        assert torch.backends.cuda.cudnn_sdp_enabled()  # put back after the step
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)

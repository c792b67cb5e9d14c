"""Checkpoints: round trips, atomic saves, Hugging Face loading, finding and resolving."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from areno_core.errors import ConfigError
from areno_core.train.checkpoint import (
    check_writable_dir,
    find_latest_checkpoint,
    load_checkpoint,
    read_checkpoint_config,
    resolve_resume,
    save_checkpoint,
)
from areno_core.train.optim import build_optimizer, build_scheduler

BATCH = torch.tensor([[1, 5, 9, 13, 17, 21], [2, 6, 10, 14, 18, 22]])
CONFIG = {"basic": {"algo": "sft", "seed": 3}, "train": {"lr": 0.01, "betas": (0.9, 0.99)}}


def _tiny_model(seed: int, *, tie: bool = False) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=tie,
    )
    return Qwen3ForCausalLM(config)


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"w{i}": i for i in range(62)}
    vocab["<unk>"] = 62
    vocab["<eos>"] = 63
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")


def _trainer(seed: int) -> tuple[Qwen3ForCausalLM, Any, Any]:
    model = _tiny_model(seed)
    opt = build_optimizer(
        model.parameters(), lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, adam_8bit=False
    )
    sched = build_scheduler(opt, lr=0.01, min_lr=0.001, decay_steps=10, style="cosine")
    return model, opt, sched


def _train_step(model: nn.Module, opt: Any, sched: Any) -> None:
    loss = model(input_ids=BATCH, labels=BATCH).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def _save(root: Path, step: int, model: nn.Module, opt: Any, sched: Any, **kw: Any) -> Path:
    return save_checkpoint(
        root,
        step,
        model=model,
        tokenizer=kw.pop("tokenizer", None) or _tiny_tokenizer(),
        optimizer=opt,
        scheduler=sched,
        trainer_state=kw.pop("trainer_state", {"epoch": 0, "index": step * 2}),
        config=CONFIG,
        **kw,
    )


def _draw(gen: torch.Generator) -> list[float]:
    return [
        random.random(),
        float(np.random.rand()),
        *torch.rand(2).tolist(),
        *torch.rand(2, generator=gen).tolist(),
    ]


def _clone_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_save_load_round_trip_restores_weights_moments_lr_and_rng(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    for _ in range(2):
        _train_step(model, opt, sched)
    gen = torch.Generator().manual_seed(11)
    random.seed(5)
    np.random.seed(6)
    path = _save(tmp_path, 2, model, opt, sched, generators={"data": gen})
    saved_weights = _clone_state(model)
    saved_moments = {
        k: (v["exp_avg"].clone(), v["exp_avg_sq"].clone())
        for k, v in opt.state_dict()["state"].items()
    }
    saved_lr = sched.get_last_lr()
    draws_after_save = _draw(gen)
    _train_step(model, opt, sched)
    weights_after_next_step = _clone_state(model)

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    model2, opt2, sched2 = _trainer(seed=1)
    gen2 = torch.Generator().manual_seed(12)
    state = load_checkpoint(
        path, model=model2, optimizer=opt2, scheduler=sched2, generators={"data": gen2}
    )

    assert state == {"epoch": 0, "index": 4, "step": 2}
    for key, value in saved_weights.items():
        torch.testing.assert_close(model2.state_dict()[key], value, rtol=0.0, atol=0.0)
    for key, (avg, avg_sq) in saved_moments.items():
        restored = opt2.state_dict()["state"][key]
        torch.testing.assert_close(restored["exp_avg"], avg, rtol=0.0, atol=0.0)
        torch.testing.assert_close(restored["exp_avg_sq"], avg_sq, rtol=0.0, atol=0.0)
    torch.testing.assert_close(sched2.get_last_lr(), saved_lr, rtol=0.0, atol=0.0)
    torch.testing.assert_close(opt2.param_groups[0]["lr"], saved_lr[0], rtol=0.0, atol=0.0)
    assert _draw(gen2) == draws_after_save
    _train_step(model2, opt2, sched2)
    for key, value in weights_after_next_step.items():
        torch.testing.assert_close(model2.state_dict()[key], value, rtol=0.0, atol=0.0)


def test_save_checkpoint_layout_manifest_and_config(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    path = _save(tmp_path / "run", 5, model, opt, sched)
    assert path == tmp_path / "run" / "step_5"
    assert (tmp_path / "run" / "latest").read_text() == "step_5\n"
    names = set(os.listdir(path))
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "trainer_state.pt",
        "config.yaml",
        "areno_checkpoint.json",
    } <= names
    assert read_checkpoint_config(path) == {
        "basic": {"algo": "sft", "seed": 3},
        "train": {"lr": 0.01, "betas": [0.9, 0.99]},
    }
    manifest = json.loads((path / "areno_checkpoint.json").read_text())
    assert manifest["format"] == "areno-checkpoint"
    assert manifest["format_version"] == 1
    assert manifest["step"] == 5
    assert manifest["files"]["trainer_state.pt"] == (path / "trainer_state.pt").stat().st_size
    assert "areno_checkpoint.json" not in manifest["files"]


def test_save_checkpoint_crash_mid_save_keeps_previous_and_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt, sched = _trainer(seed=0)
    first = _save(tmp_path, 1, model, opt, sched)
    before = _clone_state(model)
    _train_step(model, opt, sched)

    def broken_save(directory: str, **_: Any) -> None:
        Path(directory, "model.safetensors").write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        _save(tmp_path, 2, model, opt, sched)

    assert sorted(os.listdir(tmp_path)) == ["latest", "step_1"]
    assert (tmp_path / "latest").read_text() == "step_1\n"
    assert find_latest_checkpoint(tmp_path) == first
    model2, opt2, sched2 = _trainer(seed=1)
    assert load_checkpoint(first, model=model2, optimizer=opt2, scheduler=sched2)["step"] == 1
    for key, value in before.items():
        torch.testing.assert_close(model2.state_dict()[key], value, rtol=0.0, atol=0.0)


def test_save_checkpoint_same_step_twice_replaces_without_leftovers(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    _save(tmp_path, 3, model, opt, sched, trainer_state={"epoch": 0, "index": 1})
    _save(tmp_path, 3, model, opt, sched, trainer_state={"epoch": 1, "index": 0})
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_3"]
    model2, opt2, sched2 = _trainer(seed=1)
    state = load_checkpoint(tmp_path / "step_3", model=model2, optimizer=opt2, scheduler=sched2)
    assert state == {"epoch": 1, "index": 0, "step": 3}


def test_save_checkpoint_unsupported_trainer_state_raises_type_error(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    with pytest.raises(TypeError, match=r"trainer_state\['sampler'\] holds a value of type object"):
        _save(tmp_path, 1, model, opt, sched, trainer_state={"sampler": object()})
    assert not tmp_path.exists() or os.listdir(tmp_path) == []


def test_checkpoint_dir_loads_with_hf_auto_classes_tied_weights(tmp_path: Path) -> None:
    model = _tiny_model(seed=0, tie=True)
    tokenizer = _tiny_tokenizer()
    opt = build_optimizer(
        model.parameters(), lr=0.01, betas=(0.9, 0.99), weight_decay=0.0, adam_8bit=False
    )
    sched = build_scheduler(opt, lr=0.01, min_lr=0.0, decay_steps=5, style="linear")
    path = _save(tmp_path, 1, model, opt, sched, tokenizer=tokenizer)

    hf_model = AutoModelForCausalLM.from_pretrained(path)
    hf_tokenizer = AutoTokenizer.from_pretrained(path)
    assert hf_tokenizer("w1 w7 w42").input_ids == [1, 7, 42]
    assert hf_tokenizer.eos_token == "<eos>"
    with torch.no_grad():
        expected = model(input_ids=BATCH).logits
        got = hf_model(input_ids=BATCH).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)

    # The tied output layer is stored once; a strict load into a fresh tied model still works.
    fresh = _tiny_model(seed=7, tie=True)
    load_checkpoint(path, model=fresh, optimizer=None, scheduler=None)
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=BATCH).logits, expected, rtol=0.0, atol=0.0)


def _critic(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = build_optimizer(
        critic.parameters(), lr=0.1, betas=(0.9, 0.99), weight_decay=0.0, adam_8bit=False
    )
    return critic, opt


def _load_with_critic(path: Path, trainer: tuple[Any, Any, Any], critic: tuple[Any, Any]) -> None:
    """Load ``path`` into a ``(model, optimizer, scheduler)`` and a ``(critic, optimizer)``."""
    model, opt, sched = trainer
    load_checkpoint(
        path, model=model, optimizer=opt, scheduler=sched, extra_models={"critic": critic}
    )


def test_extra_model_round_trip_restores_weights_and_optimizer(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    critic, critic_opt = _critic(seed=0)
    critic(torch.ones(3, 4)).sum().backward()
    critic_opt.step()
    path = _save(tmp_path, 4, model, opt, sched, extra_models={"critic": (critic, critic_opt)})
    assert (path / "critic" / "model.safetensors").is_file()

    trainer2 = _trainer(seed=1)
    critic2, critic_opt2 = _critic(seed=1)
    _load_with_critic(path, trainer2, (critic2, critic_opt2))
    for key, value in critic.state_dict().items():
        torch.testing.assert_close(critic2.state_dict()[key], value, rtol=0.0, atol=0.0)
    for key, value in critic_opt.state_dict()["state"].items():
        restored = critic_opt2.state_dict()["state"][key]
        torch.testing.assert_close(restored["exp_avg"], value["exp_avg"], rtol=0.0, atol=0.0)


def test_load_checkpoint_extra_model_not_saved_raises_config_error(tmp_path: Path) -> None:
    trainer = _trainer(seed=0)
    path = _save(tmp_path, 1, *trainer)
    with pytest.raises(ConfigError, match="has no 'critic' model"):
        _load_with_critic(path, trainer, _critic(seed=0))


def test_load_checkpoint_different_architecture_raises_config_error(tmp_path: Path) -> None:
    critic, _ = _critic(seed=0)
    model, opt, sched = _trainer(seed=0)
    path = _save(tmp_path, 1, model, opt, sched, extra_models={"critic": critic})
    other = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1), nn.Linear(1, 1))
    with pytest.raises(ConfigError, match=r"missing 2 tensor\(s\), e\.g\. 3\.bias, 3\.weight"):
        load_checkpoint(
            path, model=model, optimizer=None, scheduler=None, extra_models={"critic": other}
        )


def test_find_latest_checkpoint_stale_pointer_falls_back_to_highest_complete(
    tmp_path: Path,
) -> None:
    model, opt, sched = _trainer(seed=0)
    _save(tmp_path, 2, model, opt, sched)
    _save(tmp_path, 10, model, opt, sched)
    (tmp_path / "latest").write_text("step_30\n")  # points at nothing
    (tmp_path / "step_20").mkdir()  # incomplete: no files
    (tmp_path / ".tmp-step_40-abcd").mkdir()  # an interrupted save
    assert find_latest_checkpoint(tmp_path) == tmp_path / "step_10"


def test_find_latest_checkpoint_valid_pointer_wins_over_higher_step(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    _save(tmp_path, 8, model, opt, sched)
    _save(tmp_path, 3, model, opt, sched)  # e.g. a run restarted from an earlier checkpoint
    assert find_latest_checkpoint(tmp_path) == tmp_path / "step_3"


def test_find_latest_checkpoint_empty_or_missing_root_none(tmp_path: Path) -> None:
    assert find_latest_checkpoint(tmp_path) is None
    assert find_latest_checkpoint(tmp_path / "nope") is None


def test_resolve_resume_auto_without_save_path_raises() -> None:
    with pytest.raises(ConfigError, match="--resume auto needs --save-path"):
        resolve_resume("auto", None)


def test_resolve_resume_auto_no_checkpoint_yet_returns_none(tmp_path: Path) -> None:
    assert resolve_resume("auto", str(tmp_path)) is None


def test_resolve_resume_auto_and_save_root_path_find_latest(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    _save(tmp_path, 1, model, opt, sched)
    latest = _save(tmp_path, 2, model, opt, sched)
    assert resolve_resume("auto", str(tmp_path)) == latest
    assert resolve_resume(str(tmp_path), None) == latest
    assert resolve_resume(str(latest), None) == latest


def test_resolve_resume_missing_path_raises(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        resolve_resume(str(tmp_path / "missing"), None)


def test_resolve_resume_incomplete_checkpoint_names_missing_file(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    path = _save(tmp_path / "run", 1, model, opt, sched)
    (path / "trainer_state.pt").unlink()
    with pytest.raises(ConfigError, match="not a complete areno checkpoint: trainer_state.pt is"):
        resolve_resume(str(path), None)


def test_resolve_resume_truncated_file_names_it(tmp_path: Path) -> None:
    model, opt, sched = _trainer(seed=0)
    path = _save(tmp_path / "run", 1, model, opt, sched)
    with open(path / "model.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ConfigError, match="model.safetensors has 100 bytes, expected"):
        resolve_resume(str(path), None)


def test_resolve_resume_plain_model_dir_suggests_ckpt(tmp_path: Path) -> None:
    _tiny_model(seed=0).save_pretrained(tmp_path / "hf")
    with pytest.raises(ConfigError, match="areno_checkpoint.json is missing.*pass it as --ckpt"):
        resolve_resume(str(tmp_path / "hf"), None)


def test_check_writable_dir_missing_folders_are_fine_and_nothing_is_created(tmp_path):
    check_writable_dir(tmp_path / "a" / "b", "--save-path")
    check_writable_dir(tmp_path, "--save-path")
    assert list(tmp_path.iterdir()) == []


def test_check_writable_dir_file_in_the_way_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"^--save-path '.*/f' cannot be used as a folder: it is"):
        check_writable_dir(tmp_path / "f", "--save-path")
    with pytest.raises(ConfigError, match=r"cannot be used as a folder: '.*/f' is a file, not a"):
        check_writable_dir(tmp_path / "f" / "g" / "h", "--metrics-log-dir")


def test_check_writable_dir_without_permission_names_the_folder(tmp_path, monkeypatch):
    # Root may write anywhere, so the permission answer is stubbed.
    monkeypatch.setattr("areno_core.train.checkpoint.os.access", lambda path, mode: False)
    with pytest.raises(
        ConfigError,
        match=rf"^--save-path '{tmp_path}/new' cannot be created: no write permission on "
        rf"'{tmp_path}'$",
    ):
        check_writable_dir(tmp_path / "new", "--save-path")

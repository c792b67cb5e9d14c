"""Loading models, tokenizers and value models from references."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hub_constants
from transformers import AutoModelForCausalLM, PreTrainedModel

from areno_core.errors import ConfigError
from areno_core.models import loading
from areno_core.models.loading import (
    ValueModel,
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    load_value_model,
    resolve_dtype,
)
from areno_core.models.tokenizer import build_byte_tokenizer

TINY = "random:qwen3-tiny?seed=2"
IDS = torch.tensor([[5, 6, 7, 8, 9, 10]])
PAD = 256


@pytest.fixture(scope="module")
def saved_causal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("causal")
    model, tok = load_model_and_tokenizer(TINY)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def unreachable_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point the hub endpoint at a closed local port and drop any proxy."""
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:1")
    loading._can_connect.cache_clear()
    yield
    loading._can_connect.cache_clear()


def test_load_model_and_tokenizer_random_ref_matches_byte_tokenizer() -> None:
    model, tok = load_model_and_tokenizer(TINY)
    assert isinstance(model, PreTrainedModel)
    assert tok.get_vocab() == build_byte_tokenizer().get_vocab()
    assert model.get_input_embeddings().weight.shape == (272, 64)
    assert model.dtype == torch.float32
    assert not model.training
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("bf16", torch.bfloat16), ("float32", torch.float32), ("torch.float16", torch.float16)],
)
def test_resolve_dtype_names_give_torch_dtypes(name: str, expected: torch.dtype) -> None:
    assert resolve_dtype(name) == expected
    assert resolve_dtype("auto") == "auto"


def test_resolve_dtype_unknown_name_raises_listing_valid() -> None:
    with pytest.raises(ConfigError, match=r"unknown dtype 'int3'.*bfloat16"):
        resolve_dtype("int3")


def test_load_model_dtype_string_casts_weights() -> None:
    model = load_model(TINY, dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_load_model_unknown_role_raises_listing_roles() -> None:
    with pytest.raises(ConfigError, match=r"unknown model role 'critic'.*policy, reference"):
        load_model(TINY, role="critic")


def test_load_model_reference_role_is_frozen() -> None:
    model = load_model(TINY, role="reference")
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_saved_random_model_from_pretrained_gives_identical_logits(saved_causal: Path) -> None:
    original = load_model(TINY)
    reloaded = AutoModelForCausalLM.from_pretrained(saved_causal)
    via_loader = load_model(str(saved_causal))
    expected = original(IDS).logits
    torch.testing.assert_close(reloaded(IDS).logits, expected, rtol=0.0, atol=0.0)
    torch.testing.assert_close(via_loader(IDS).logits, expected, rtol=0.0, atol=0.0)


def test_load_tokenizer_local_dir_identical_to_byte_tokenizer(saved_causal: Path) -> None:
    tok = load_tokenizer(str(saved_causal))
    fresh = build_byte_tokenizer()
    assert tok.get_vocab() == fresh.get_vocab()
    assert tok.chat_template == fresh.chat_template
    assert tok.encode("héllo <tool_call>") == fresh.encode("héllo <tool_call>")


def test_load_tokenizer_without_pad_token_uses_eos(tmp_path: Path) -> None:
    tok = build_byte_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == "<|im_end|>"
    assert loaded.pad_token_id == loaded.eos_token_id == 258


def test_load_model_missing_local_path_raises_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither an existing directory"):
        load_model(str(tmp_path / "nope"))


def test_load_model_dir_without_checkpoint_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="could not load the model from"):
        load_model(str(tmp_path))


@pytest.mark.usefixtures("unreachable_hub")
def test_load_model_hub_id_without_hub_fails_fast_with_clear_error() -> None:
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_model("areno-test/no-such-model-0123")
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "could not be downloaded" in message
    assert "no Hugging Face hub is reachable" in message
    assert "random:qwen3-tiny" in message
    assert elapsed < 5.0


@pytest.mark.usefixtures("unreachable_hub")
def test_load_tokenizer_hub_id_without_hub_fails_fast_with_clear_error() -> None:
    start = time.monotonic()
    with pytest.raises(ConfigError, match="tokenizer for 'areno-test/no-such-model-0123'"):
        load_tokenizer("areno-test/no-such-model-0123")
    assert time.monotonic() - start < 5.0


def test_hub_reachable_offline_env_is_false_without_probing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def fail(*args: object) -> bool:
        raise AssertionError("probed the network in offline mode")

    monkeypatch.setattr(loading, "_can_connect", fail)
    assert loading.hub_reachable() is False


def test_value_model_random_ref_gives_per_token_values() -> None:
    model = load_value_model(TINY)
    assert isinstance(model, ValueModel)
    mask = torch.ones_like(IDS)
    values = model(IDS, mask)
    assert values.shape == IDS.shape
    assert values.dtype == torch.float32
    assert model.score_last(IDS, mask).shape == (1,)
    assert all(p.requires_grad for p in model.parameters())


def test_value_model_random_backbone_matches_policy_init() -> None:
    policy = load_model(TINY)
    critic = load_value_model(TINY)
    torch.testing.assert_close(
        critic.backbone.layers[1].mlp.down_proj.weight,
        policy.model.layers[1].mlp.down_proj.weight,
        rtol=0.0,
        atol=0.0,
    )


def test_value_model_score_last_padded_rows_match_unpadded() -> None:
    model = load_value_model(TINY)
    short = [5, 6, 7]
    full = [5, 6, 7, 8, 9]
    ids = torch.tensor([[*short, PAD, PAD], [PAD, PAD, *short], full])
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    scores = model.score_last(ids, mask)
    alone_short = model.score_last(torch.tensor([short]), torch.ones(1, 3, dtype=torch.long))
    alone_full = model.score_last(torch.tensor([full]), torch.ones(1, 5, dtype=torch.long))
    expected = torch.cat([alone_short, alone_short, alone_full])
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)
    # The right-padded row's values at real positions equal the unpadded ones.
    values = model(ids, mask)
    alone = model(torch.tensor([short]), torch.ones(1, 3, dtype=torch.long))
    torch.testing.assert_close(values[0, :3], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values[1, 2:], alone[0], rtol=1e-5, atol=1e-5)


def test_value_model_save_then_load_keeps_head_and_scores(tmp_path: Path) -> None:
    model = load_value_model(TINY)
    model.save_pretrained(tmp_path)
    reloaded = load_value_model(str(tmp_path), role="reward")
    mask = torch.ones_like(IDS)
    torch.testing.assert_close(
        reloaded.score_last(IDS, mask), model.score_last(IDS, mask), rtol=0.0, atol=0.0
    )
    assert not reloaded.training
    assert not any(p.requires_grad for p in reloaded.parameters())


def test_value_model_saved_weights_load_strictly_into_a_live_value_model(tmp_path: Path) -> None:
    from areno_core.train.checkpoint import load_module_weights

    model = load_value_model(TINY)
    model.save_pretrained(tmp_path)  # classifier layout: model.*, score.*
    other = load_value_model("random:qwen3-tiny?seed=5")  # other weights and head, same shapes
    mask = torch.ones_like(IDS)
    assert not torch.equal(other.score_last(IDS, mask), model.score_last(IDS, mask))
    load_module_weights(other, tmp_path)  # the checkpoint path: backbone.*, head.*
    for key, value in model.state_dict().items():
        torch.testing.assert_close(other.state_dict()[key], value, rtol=0.0, atol=0.0)
    renamed = model.convert_saved_weights({"model.norm.weight": IDS, "score.weight": IDS})
    assert sorted(renamed) == ["backbone.norm.weight", "head.weight"]


def test_value_model_from_causal_checkpoint_reuses_backbone(saved_causal: Path) -> None:
    policy = load_model(str(saved_causal))
    critic = load_value_model(str(saved_causal))
    torch.testing.assert_close(
        critic.backbone.embed_tokens.weight,
        policy.model.embed_tokens.weight,
        rtol=0.0,
        atol=0.0,
    )
    assert critic.head.weight.shape == (1, 64)
    assert critic(IDS, torch.ones_like(IDS)).shape == IDS.shape


def test_load_value_model_unknown_role_raises() -> None:
    with pytest.raises(ConfigError, match=r"unknown model role 'policy'.*critic, reward"):
        load_value_model(TINY, role="policy")

"""``random:`` references: parsing, presets, deterministic initialisation."""

from __future__ import annotations

import pytest
import torch

from areno_core.errors import ConfigError
from areno_core.models.scratch import (
    PRESETS,
    build_random_config,
    build_random_model,
    count_parameters,
    parse_random_ref,
)
from areno_core.models.tokenizer import build_byte_tokenizer

# Also stated in docs/models.md.
PRESET_PARAMETERS = {"tiny": 91_520, "mini": 2_414_400, "small": 20_596_224}


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize(("preset", "expected"), sorted(PRESET_PARAMETERS.items()))
def test_preset_parameter_count_matches_documented(preset: str, expected: int) -> None:
    model = build_random_model(f"random:qwen3-{preset}")
    assert count_parameters(model) == expected


def test_presets_documented_all_have_counts() -> None:
    assert set(PRESETS) == set(PRESET_PARAMETERS)


def test_tiny_preset_has_requested_shape() -> None:
    config = build_random_config("random:qwen3-tiny")
    shape = (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
        config.max_position_embeddings,
    )
    assert shape == (64, 2, 4, 2, 16, 128, 2048)


def test_random_config_vocab_and_special_ids_come_from_tokenizer() -> None:
    tok = build_byte_tokenizer()
    config = build_random_config("random:qwen3", tok)
    assert config.vocab_size == 272  # 265 tokens rounded up to a multiple of 8
    assert config.vocab_size >= len(tok)
    assert (config.eos_token_id, config.pad_token_id, config.bos_token_id) == (258, 256, 256)
    assert config.tie_word_embeddings is True


def test_random_model_tied_embeddings_share_storage() -> None:
    model = build_random_model("random:qwen3-tiny")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.generation_config.eos_token_id == 258


def test_random_model_same_seed_gives_identical_weights() -> None:
    a = build_random_model("random:qwen3-tiny?seed=7")
    b = build_random_model("random:qwen3?seed=7")  # the default preset is tiny
    assert _same_weights(a, b)


def test_random_model_default_seed_is_zero() -> None:
    default = build_random_model("random:qwen3")
    assert _same_weights(default, build_random_model("random:qwen3?seed=0"))


def test_random_model_different_seed_gives_different_weights() -> None:
    a = build_random_model("random:qwen3-tiny?seed=0")
    b = build_random_model("random:qwen3-tiny?seed=1")
    assert not torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)


def test_random_model_build_leaves_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_random_model("random:qwen3-tiny?seed=5")
    torch.testing.assert_close(torch.rand(3), expected, rtol=0.0, atol=0.0)


def test_random_ref_overrides_apply_and_move_head_dim() -> None:
    config = build_random_config("random:qwen3?hidden_size=128&num_hidden_layers=4&seed=3")
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (128, 4, 32)
    assert config.intermediate_size == PRESETS["tiny"]["intermediate_size"]
    assert parse_random_ref("random:qwen3?hidden_size=128&seed=3").seed == 3


def test_random_ref_explicit_head_dim_and_rope_theta_kept() -> None:
    config = build_random_config("random:qwen3-mini?hidden_size=256&head_dim=16&rope_theta=5e5")
    assert (config.hidden_size, config.head_dim) == (256, 16)
    assert config.rope_parameters["rope_theta"] == pytest.approx(5e5)


def test_random_model_forward_gives_vocab_logits() -> None:
    model = build_random_model("random:qwen3-tiny?num_hidden_layers=1")
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 272)
    assert torch.isfinite(logits).all()


def test_parse_random_ref_unknown_preset_raises_listing_presets() -> None:
    with pytest.raises(ConfigError, match=r"unknown preset 'huge'.*tiny, mini, small"):
        parse_random_ref("random:qwen3-huge")


def test_parse_random_ref_unknown_architecture_raises_listing_valid() -> None:
    with pytest.raises(ConfigError, match=r"unknown architecture 'llama'.*qwen3"):
        parse_random_ref("random:llama-tiny")


def test_parse_random_ref_unknown_override_raises_listing_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown override 'depth'.*hidden_size.*seed"):
        parse_random_ref("random:qwen3?depth=3")


@pytest.mark.parametrize(
    ("query", "key"),
    [
        ("hidden_size=abc", "hidden_size"),
        ("num_hidden_layers=0", "num_hidden_layers"),
        ("seed=-1", "seed"),
        ("seed=", "seed"),
        ("rms_norm_eps=0", "rms_norm_eps"),
        ("tie_word_embeddings=maybe", "tie_word_embeddings"),
    ],
)
def test_parse_random_ref_bad_value_raises_naming_key(query: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"bad value .* for '{key}'"):
        parse_random_ref(f"random:qwen3?{query}")


def test_random_ref_heads_not_multiple_of_kv_heads_raises() -> None:
    with pytest.raises(ConfigError, match="multiple of num_key_value_heads"):
        build_random_config("random:qwen3?num_attention_heads=3&head_dim=16")


def test_random_ref_hidden_not_divisible_by_heads_raises() -> None:
    with pytest.raises(ConfigError, match="not divisible"):
        build_random_config("random:qwen3?hidden_size=66")


def test_random_ref_chat_template_picks_the_tokenizer_template_only() -> None:
    from areno_core.models.loading import load_tokenizer
    from areno_core.models.tokenizer import CHAT_TEMPLATE, COMPACT_CHAT_TEMPLATE

    spec = parse_random_ref("random:qwen3?hidden_size=128&chat_template=chatml-compact")
    assert spec.chat_template == "chatml-compact"
    assert "chat_template" not in spec.architecture_kwargs()
    assert load_tokenizer("random:qwen3?chat_template=chatml-compact").chat_template == (
        COMPACT_CHAT_TEMPLATE
    )
    assert load_tokenizer("random:qwen3").chat_template == CHAT_TEMPLATE
    with pytest.raises(ConfigError, match="bad value 'x' for 'chat_template'"):
        parse_random_ref("random:qwen3?chat_template=x")

"""Model shapes: parameter counts against the models transformers builds from the same
configs (exact) and against the counts the models' cards publish."""

from __future__ import annotations

import json

import attrs
import pytest
import torch
import transformers

from areno_core.errors import ConfigError
from areno_core.models.scratch import build_random_model
from areno_core.plan.shapes import (
    PUBLISHED,
    ModelShape,
    published_parameter_count,
    published_shape,
    resolve_shape,
)

# Model cards state counts to 2-3 significant digits (Qwen3-1.7B: "1.7B" for 1.72B).
CARD_TOLERANCE = 0.015


def transformers_config(shape: ModelShape) -> transformers.PretrainedConfig:
    sizes = {
        "num_hidden_layers": shape.layers, "hidden_size": shape.hidden,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "intermediate_size": shape.intermediate, "vocab_size": shape.vocab,
        "tie_word_embeddings": shape.tied,
    }  # fmt: skip
    if shape.family == "qwen2":
        return transformers.Qwen2Config(**sizes)
    if shape.family == "llama":
        return transformers.LlamaConfig(**sizes, head_dim=shape.head_dim)
    if shape.family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **sizes, head_dim=shape.head_dim, num_experts=shape.experts,
            num_experts_per_tok=shape.experts_per_token,
            moe_intermediate_size=shape.expert_intermediate, decoder_sparse_step=1,
            mlp_only_layers=[],
        )  # fmt: skip
    return transformers.Qwen3Config(**sizes, head_dim=shape.head_dim)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_shape_counts_what_transformers_builds_and_what_the_card_says(name):
    shape = published_shape(name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers_config(shape))
    assert shape.total_params() == sum(p.numel() for p in model.parameters())
    card = published_parameter_count(name)
    assert shape.total_params() == pytest.approx(card, rel=CARD_TOLERANCE)


def test_random_and_local_references_read_their_config(tmp_path):
    model = build_random_model("random:qwen3-small")
    shape = resolve_shape("random:qwen3-small")
    assert shape.total_params() == sum(p.numel() for p in model.parameters())
    model.config.save_pretrained(tmp_path)
    from_file = resolve_shape(str(tmp_path / "config.json"))
    assert attrs.evolve(from_file, name=str(tmp_path)) == resolve_shape(str(tmp_path))
    assert resolve_shape(str(tmp_path)).total_params() == shape.total_params()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3"


def test_hub_ids_match_case_insensitively_with_base_and_instruct_variants():
    assert published_shape("qwen/qwen3-8b-base").name == "Qwen/Qwen3-8B"
    assert published_shape("meta-llama/Llama-3.1-8B-Instruct").name == "meta-llama/Llama-3.1-8B"
    assert published_shape("someone/else") is None


def test_unknown_reference_and_bad_sizes_are_clear_errors():
    with pytest.raises(ConfigError, match="'org/unknown' is neither a published model"):
        resolve_shape("org/unknown")
    with pytest.raises(ConfigError, match="12 attention heads are not a multiple of 5"):
        ModelShape(layers=2, hidden=64, heads=12, kv_heads=5, head_dim=8, intermediate=8, vocab=9)

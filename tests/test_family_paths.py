"""The families x paths table of docs/models.md, as the code answers it."""

from __future__ import annotations

from pathlib import Path

from areno_core.docs_gen import render_family_blocks
from areno_core.family_paths import family_paths, family_table
from areno_core.models.families import available_families, family

MODELS_DOC = Path(__file__).resolve().parent.parent / "docs" / "models.md"


def test_family_paths_gemma3_decodes_through_transformers_and_scores_rows_in_full() -> None:
    paths = family_paths(family("gemma3"))
    assert paths.attention == "2 of 3 layers sliding (8), the rest full"
    assert paths.native_decode == "transformers forward"
    assert paths.training_forward == "transformers, every row in full"
    assert paths.tp_plan == "plan"


def test_family_paths_fused_projections_and_experts_refuse_tensor_parallel() -> None:
    for name in ("phi3", "olmo2", "qwen3_moe"):
        assert family_paths(family(name)).tp_plan == "refused (names the family)", name


def test_family_paths_llama_runs_lean_packed_and_has_a_tp_plan() -> None:
    paths = family_paths(family("llama"))
    assert paths.attention == "full"
    assert paths.native_decode == "lean forward on CPU"
    assert paths.training_forward.startswith("packed lean forward")
    assert paths.tp_plan == "plan"
    assert paths.lora_targets == "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"


def test_family_paths_full_attention_outside_the_lean_pass_shares_prompts() -> None:
    assert family_paths(family("phi3")).training_forward == "transformers, shared prompts"
    assert family_paths(family("mistral")).attention == "sliding (8) in every layer"


def test_family_table_has_one_row_per_family_in_each_table() -> None:
    table = family_table()
    for f in available_families():
        assert table.count(f"| `{f.name}` |") == 2, f.name
        assert f"`{f.causal_lm_cls}`" in table


def test_render_family_blocks_replaces_a_stale_block_and_leaves_other_text() -> None:
    text = "before\n<!-- families -->\nold table\n<!-- /families -->\nafter\n"
    rendered = render_family_blocks(text)
    assert rendered.startswith("before\n<!-- families -->\n| family |")
    assert rendered.endswith("<!-- /families -->\nafter\n")
    assert "old table" not in rendered
    assert render_family_blocks("no block here\n") == "no block here\n"


def test_models_doc_holds_the_generated_family_table() -> None:
    assert family_table() in MODELS_DOC.read_text()

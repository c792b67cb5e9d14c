"""Decode attention to a shared prompt once per group: the merged two-part attention on
hand-made tensors, the prefix store's bookkeeping, and the engine's samples with the shared
layout against the copy-per-row layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from areno_core.contracts.engine import EngineOptions
from areno_core.engine_conformance import EOS, TINY_SIZES, VOCAB, conformance_model
from areno_core.rollout.generation import row_slots as _slots
from areno_core.rollout.generation import share_prompts
from areno_core.rollout.native import NativeEngine, NativeEngineConfig
from areno_core.rollout.native_config import SHARED_PROMPT_MIN_TOKENS
from areno_core.rollout.prefix import (
    PrefixStore,
    attention_with_lse,
    grouped_prefix_attention,
    merge_partial_attention,
)
from areno_core.types import Completion, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the attention pieces ---------------------------------------------------------------------


def test_merge_partial_attention_two_single_keys_gives_softmax_weights() -> None:
    # Key set A: one key with score 0 and value 1; set B: one key with score log(3), value 5.
    # Joint softmax weights are 1/4 and 3/4: output 1/4 * 1 + 3/4 * 5 = 4.
    out = merge_partial_attention(
        torch.tensor([[1.0]]), torch.tensor([0.0]), torch.tensor([[5.0]]), torch.tensor([1.0986123])
    )
    torch.testing.assert_close(out, torch.tensor([[4.0]]), atol=1e-6, rtol=0)


def test_attention_with_lse_matches_hand_written_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=gen) for _ in range(3))
    visible = torch.tensor([[True, True, False, True], [False, True, True, True]])
    # Keys are the third dim of k here: reshape to [B, Hk, S, D] with S = 4.
    bias = torch.zeros(2, 1, 1, 4).masked_fill(~visible[:, None, None, :], float("-inf"))
    out, lse = attention_with_lse(q, k, v, bias, 0.3)
    scores = q @ k.transpose(-1, -2) * 0.3 + bias
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, scores.softmax(-1) @ v, atol=1e-5, rtol=1e-5)


def _reference_attention(q, prefix_k, prefix_v, prefix_ok, suffix_k, suffix_v, suffix_ok, group):
    """Plain SDPA of each row over [its group's prompt ; its own tokens], with the prompt
    copied into the row (what the copy-per-row layout computes)."""
    keys = torch.cat([prefix_k[group], suffix_k], dim=2)
    values = torch.cat([prefix_v[group], suffix_v], dim=2)
    visible = torch.cat([prefix_ok[group], suffix_ok], dim=1)[:, None, None, :]
    n_rep = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(n_rep, 1), values.repeat_interleave(n_rep, 1)
    out = F.scaled_dot_product_attention(
        q.float(), keys.float(), values.float(), attn_mask=visible, scale=0.25
    )
    return out.transpose(1, 2)  # [B, 1, H, D]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dtype", "tol"),
    [(4, 2, torch.float32, 1e-5), (4, 4, torch.float32, 1e-5), (6, 2, torch.bfloat16, 1e-2)],
)
def test_grouped_prefix_attention_equals_sdpa_over_prompt_and_suffix(
    heads: int, kv_heads: int, dtype: torch.dtype, tol: float
) -> None:
    gen = torch.Generator().manual_seed(3)
    dim, prompt_cols, suffix_cols = 8, 7, 5
    # Three groups; group 0 has rows in slots 0, 2, 3 (slot 1 finished), group 1 is empty
    # (all rows done), group 2 has one row in slot 1. Rows are out of group order.
    group = torch.tensor([2, 0, 0, 0])
    slot = torch.tensor([1, 3, 0, 2])
    groups, slots = 3, 4
    rows = len(group)
    prefix_k = torch.randn(groups, kv_heads, prompt_cols, dim, generator=gen).to(dtype)
    prefix_v = torch.randn(groups, kv_heads, prompt_cols, dim, generator=gen).to(dtype)
    suffix_k = torch.randn(rows, kv_heads, suffix_cols, dim, generator=gen).to(dtype)
    suffix_v = torch.randn(rows, kv_heads, suffix_cols, dim, generator=gen).to(dtype)
    q = torch.randn(rows, heads, 1, dim, generator=gen).to(dtype)
    # Left padding: prompts of 7, 2 and 4 tokens right-aligned; suffixes of 5, 1, 3, 2 tokens.
    cols = torch.arange(prompt_cols)
    prefix_ok = cols[None, :] >= torch.tensor([0, 5, 3])[:, None]
    suffix_ok = torch.arange(suffix_cols)[None, :] >= torch.tensor([0, 4, 2, 3])[:, None]
    prefix_bias = torch.zeros(groups, 1, 1, prompt_cols).masked_fill(
        ~prefix_ok[:, None, None, :], float("-inf")
    )
    suffix_bias = torch.zeros(rows, 1, 1, suffix_cols).masked_fill(
        ~suffix_ok[:, None, None, :], float("-inf")
    )
    got = grouped_prefix_attention(
        q,
        prefix_k,
        prefix_v,
        prefix_bias,
        suffix_k,
        suffix_v,
        suffix_bias,
        group,
        slot,
        slots,
        0.25,
    )
    want = _reference_attention(
        q, prefix_k, prefix_v, prefix_ok, suffix_k, suffix_v, suffix_ok, group
    )
    assert got.shape == (rows, 1, heads, dim) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


# -- the prefix store's bookkeeping -----------------------------------------------------------


def test_prefix_store_reuses_a_freed_group_and_grows_when_full() -> None:
    store = PrefixStore(num_layers=1, device=torch.device("cpu"))
    first = store.allocate(np.array([5, 3]), np.array([2, 1]))
    assert first.tolist() == [0, 1] and store.cols == 16
    # Prompts right-aligned: group 1's 3 tokens sit in the last 3 columns.
    assert store.valid[1].tolist() == [False] * 13 + [True] * 3
    store.release(np.array([1]))  # group 1's only row finished
    second = store.allocate(np.array([20]), np.array([4]))
    assert second.tolist() == [1] and store.cols == 32  # reused, then widened to 32 columns
    assert store.valid[0].sum() == 5 and store.valid[1].sum() == 20
    third = store.allocate(np.array([1, 1]), np.array([1, 1]))
    assert third.tolist() == [2, 3] and store.capacity == 4
    store.release(np.array([0, 0]))
    assert store.live.tolist() == [0, 4, 1, 1]


def test_slots_number_each_entry_among_equal_values() -> None:
    assert _slots(np.array([4, 4, 7, 4, 7, 0])).tolist() == [0, 1, 0, 2, 1, 0]


# -- the engine: shared layout against copies per row -----------------------------------------


@pytest.fixture(scope="module")
def model():
    return conformance_model()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in (9, 2, 14, 5, 1)]


def _generate(model, prompts, sampling, *, shared: bool | None, n: int, max_running=None):
    engine = NativeEngine(
        model,
        [EOS],
        EngineOptions(attn_backend="native", max_running=max_running),
        NativeEngineConfig(shared_prompt_cache=shared),
    )
    return engine, engine.generate(prompts, sampling, n=n)


def _assert_same_samples(a: list[list[Completion]], b: list[list[Completion]], atol: float):
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    for group_a, group_b in zip(a, b, strict=True):
        for ca, cb in zip(group_a, group_b, strict=True):
            torch.testing.assert_close(
                torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=atol, rtol=0
            )


@pytest.mark.parametrize("max_running", [None, 7])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=16, greedy=True),
        SamplingParams(max_new_tokens=16, temperature=1.0, seed=11),
    ],
    ids=["greedy", "seeded"],
)
def test_engine_shared_prompt_cache_samples_what_copies_per_row_sample(
    model, prompts, sampling, max_running
) -> None:
    shared_engine, shared = _generate(
        model, prompts, sampling, shared=True, n=3, max_running=max_running
    )
    copy_engine, copied = _generate(
        model, prompts, sampling, shared=False, n=3, max_running=max_running
    )
    _assert_same_samples(shared, copied, atol=1e-5)
    # The shared layout really ran (prompts in the prefix store), the copy layout did not.
    assert shared_engine._store.prefix.capacity > 0
    assert copy_engine._store.prefix.capacity == 0
    # Rows finished at different lengths (EOS), so groups thinned out while others ran.
    assert len({len(c.token_ids) for g in shared for c in g}) > 2


def test_engine_shared_prompt_cache_on_bfloat16_model_stays_close_to_copies(model, prompts):
    bf16 = conformance_model().to(torch.bfloat16)
    sampling = SamplingParams(max_new_tokens=10, greedy=True)
    _, shared = _generate(bf16, prompts, sampling, shared=True, n=2, max_running=5)
    _, copied = _generate(bf16, prompts, sampling, shared=False, n=2, max_running=5)
    # Both attend in float32 over the same bfloat16 keys: only the summation order differs.
    _assert_same_samples(shared, copied, atol=1e-3)


def _other_family(model_cls: type, config_cls: type, seed: int, kv_heads: int) -> torch.nn.Module:
    """A random model of another family at the conformance model's sizes (no q/k norms, its
    own head layout)."""
    torch.manual_seed(seed)
    config = config_cls(
        **TINY_SIZES,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )
    return model_cls(config).eval()


@pytest.mark.parametrize(
    "family",
    [(Qwen2ForCausalLM, Qwen2Config, 1, 1), (LlamaForCausalLM, LlamaConfig, 2, 4)],
    ids=["qwen2", "llama"],
)
def test_engine_shared_prompt_cache_other_families_match_copies(family, prompts) -> None:
    other = _other_family(*family)
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=4)
    _, shared = _generate(other, prompts, sampling, shared=True, n=4, max_running=6)
    _, copied = _generate(other, prompts, sampling, shared=False, n=4, max_running=6)
    _assert_same_samples(shared, copied, atol=1e-5)


def test_engine_one_sample_per_prompt_keeps_prompts_in_the_rows(model, prompts) -> None:
    engine, _ = _generate(
        model, prompts, SamplingParams(max_new_tokens=4, greedy=True), shared=True, n=1
    )
    assert engine._store.prefix.capacity == 0 and engine._store.prefix.nbytes() == 0


def test_engine_shared_prompt_cache_holds_less_state_for_long_shared_prompts(model) -> None:
    gen = torch.Generator().manual_seed(5)
    long_prompts = [torch.randint(4, VOCAB, (120,), generator=gen).tolist() for _ in range(4)]
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=2)
    shared_engine, shared = _generate(model, long_prompts, sampling, shared=True, n=8)
    copy_engine, copied = _generate(model, long_prompts, sampling, shared=False, n=8)
    _assert_same_samples(shared, copied, atol=1e-5)
    # 32 rows x ~128 prompt columns copied, against 4 groups x 128 columns plus 32 short rows.
    assert shared_engine.state_bytes * 3 < copy_engine.state_bytes


def test_engine_shared_prompt_cache_widens_and_adds_groups_while_rows_run(model) -> None:
    # Short prompts first fill 16-column groups; a 40-token prompt arrives while their rows
    # still run (the store widens, moving the live prompts), and more groups than slots exist
    # at first are needed as rows are admitted one by one.
    gen = torch.Generator().manual_seed(9)
    lengths = (3, 4, 40, 6, 33)
    long_mix = [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in lengths]
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=6)
    shared_engine, shared = _generate(model, long_mix, sampling, shared=True, n=3, max_running=4)
    _, copied = _generate(model, long_mix, sampling, shared=False, n=3, max_running=4)
    _assert_same_samples(shared, copied, atol=1e-5)
    prefix = shared_engine._store.prefix
    assert prefix.cols == 48 and prefix.capacity > 2


# -- auto: the layout chosen by the call's prompt lengths --------------------------------------


def test_share_prompts_auto_follows_the_mean_length_of_the_kept_prompts() -> None:
    prompts = [[1] * 4, [1] * 30, [1] * 10]
    assert SHARED_PROMPT_MIN_TOKENS == 16
    # Kept: 4 and 30 tokens, mean 17; 4 and 10, mean 7; the skipped prompt does not count.
    assert share_prompts(None, prompts, [0, 1]) is True
    assert share_prompts(None, prompts, [0, 2]) is False
    assert share_prompts(None, [[1] * 16], [0]) is True
    assert share_prompts(None, [[1] * 15], [0]) is False
    assert share_prompts(None, prompts, []) is False
    # A setting decides for every call.
    assert share_prompts(True, prompts, [0, 2]) is True
    assert share_prompts(False, prompts, [1]) is False


@pytest.mark.parametrize(("length", "expect_shared"), [(6, False), (24, True)])
def test_engine_auto_shares_long_prompts_and_copies_short_ones(model, length, expect_shared):
    gen = torch.Generator().manual_seed(3)
    batch = [torch.randint(4, VOCAB, (length,), generator=gen).tolist() for _ in range(3)]
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=1)
    auto_engine, auto = _generate(model, batch, sampling, shared=None, n=4)
    _, forced = _generate(model, batch, sampling, shared=expect_shared, n=4)
    assert (auto_engine._store.prefix.capacity > 0) is expect_shared
    # The same layout as the forced one, so the same numbers exactly.
    assert [[c.token_ids for c in g] for g in auto] == [[c.token_ids for c in g] for g in forced]
    assert [[c.logprobs for c in g] for g in auto] == [[c.logprobs for c in g] for g in forced]

"""Tests for the native rollout engine on a tiny randomly initialised Qwen3 model, beyond the
engine conformance suite it also passes (tests/rollout/test_engine_conformance.py)."""

from __future__ import annotations

import logging

import attrs
import pytest
import torch
from transformers import Qwen3ForCausalLM

from areno_core import log
from areno_core.engine_conformance import (
    EOS,
    VOCAB,
    conformance_model,
    conformance_prompts,
    tokens,
)
from areno_core.rollout import (
    EngineOptions,
    NativeEngine,
    RolloutEngine,
    RolloutSession,
    create_native_engine,
    seeded,
)
from areno_core.rollout.native import NativeEngineConfig
from areno_core.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> Qwen3ForCausalLM:
    return conformance_model()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return conformance_prompts()


def _engine(
    model: torch.nn.Module,
    *,
    prefill_batch_tokens: int = 16384,
    shared_prompt_cache: bool = True,
    **options: object,
) -> NativeEngine:
    return NativeEngine(
        model,
        [EOS],
        EngineOptions(attn_backend="native", **options),  # type: ignore[arg-type]
        NativeEngineConfig(
            prefill_batch_tokens=prefill_batch_tokens, shared_prompt_cache=shared_prompt_cache
        ),
    )


def test_generate_greedy_matches_hf_generate_token_for_token(
    model: Qwen3ForCausalLM, prompts: list[list[int]]
) -> None:
    out = _engine(model).generate(prompts, SamplingParams(max_new_tokens=16, greedy=True))
    reasons = set()
    for prompt, group in zip(prompts, out, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            expected = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16
            )[0, len(prompt) :].tolist()
        assert list(group[0].token_ids) == expected
        reasons.add(group[0].finish_reason)
    assert reasons == {"stop", "length"}


def test_generate_continuous_batching_greedy_matches_one_big_batch(
    model: Qwen3ForCausalLM, prompts: list[list[int]]
) -> None:
    sampling = SamplingParams(max_new_tokens=40, greedy=True)
    big = _engine(model).generate(prompts[:6], sampling)
    small = _engine(model, max_running=2)
    rolling = small.generate(prompts[:6], sampling)
    assert tokens(rolling) == tokens(big)
    assert small.stats["peak_running"] == 2
    # One row at a time, and prompts split across many prefill passes, give the same too.
    single = _engine(model, max_running=1, prefill_batch_tokens=4).generate(prompts[:6], sampling)
    assert tokens(single) == tokens(big)


def test_generate_sampling_same_seed_any_max_running_gives_same_samples(
    model: Qwen3ForCausalLM, prompts: list[list[int]]
) -> None:
    sampling = SamplingParams(max_new_tokens=20, temperature=0.8, top_p=0.95, seed=11)
    wide = _engine(model).generate(prompts, sampling, n=3)
    narrow = _engine(model, max_running=4).generate(prompts, sampling, n=3)
    assert tokens(narrow) == tokens(wide)


def test_generate_n_samples_differ_and_repeat_with_same_seed(
    model: Qwen3ForCausalLM, prompts: list[list[int]]
) -> None:
    engine = _engine(model)
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, seed=3)
    first = engine.generate(prompts[:2], sampling, n=4)
    again = engine.generate(prompts[:2], sampling, n=4)
    other = engine.generate(prompts[:2], SamplingParams(max_new_tokens=10, seed=4), n=4)
    assert [len(g) for g in first] == [4, 4]
    for group in first:
        assert len({c.token_ids for c in group}) == 4
    assert tokens(again) == tokens(first)
    assert tokens(other) != tokens(first)


def test_generate_seed_drawn_from_generator_reproducible(
    model: Qwen3ForCausalLM, prompts: list[list[int]]
) -> None:
    engine = _engine(model)
    sampling = SamplingParams(max_new_tokens=8)
    a = engine.generate(prompts, seeded(sampling, torch.Generator().manual_seed(9)), n=2)
    b = engine.generate(prompts, seeded(sampling, torch.Generator().manual_seed(9)), n=2)
    c = engine.generate(prompts, seeded(sampling, torch.Generator().manual_seed(10)), n=2)
    assert tokens(a) == tokens(b)
    assert tokens(a) != tokens(c)


def test_generate_max_new_tokens_one_gives_single_token(
    model: Qwen3ForCausalLM, prompts: list[list[int]]
) -> None:
    out = _engine(model).generate(prompts, SamplingParams(max_new_tokens=1, greedy=True))
    assert all(len(g[0].token_ids) == 1 for g in out)
    assert all(g[0].finish_reason in ("stop", "length") for g in out)


def test_generate_empty_prompt_raises_value_error(model: Qwen3ForCausalLM) -> None:
    with pytest.raises(ValueError, match="no tokens"):
        _engine(model).generate([[]], SamplingParams())


def test_generate_restores_train_mode_and_leaves_no_grad_state(model: Qwen3ForCausalLM) -> None:
    model.train()
    try:
        _engine(model).generate([[5, 6]], SamplingParams(max_new_tokens=3))
        assert model.training
        assert all(p.grad is None for p in model.parameters())
    finally:
        model.eval()


def test_session_drop_state_frees_cache_and_default_keeps_it(model: Qwen3ForCausalLM) -> None:
    engine = _engine(model)
    sampling = SamplingParams(max_new_tokens=5, greedy=True)
    with RolloutSession(engine) as session:
        session.generate([[5, 6, 7]], sampling)
    assert engine.state_bytes > 0
    with RolloutSession(engine, drop_state=True) as session:
        session.generate([[5, 6, 7]], sampling)
        assert engine.state_bytes > 0
    assert engine.state_bytes == 0
    again = engine.generate([[5, 6, 7]], sampling)  # rebuilt on demand
    assert len(again[0][0].token_ids) > 0


def test_session_stats_reset_per_session_and_counttokens(model: Qwen3ForCausalLM) -> None:
    engine = _engine(model)
    sampling = SamplingParams(max_new_tokens=4, greedy=True)
    with RolloutSession(engine) as session:
        out = session.generate([[5, 6], [7, 8, 9]], sampling, n=2)
    generated = sum(len(c.token_ids) for g in out for c in g)
    assert engine.stats["generated_tokens"] == generated
    assert engine.stats["generate_time_s"] > 0
    with RolloutSession(engine):
        assert engine.stats["generated_tokens"] == 0


def test_session_generate_outside_with_block_raises(model: Qwen3ForCausalLM) -> None:
    session = RolloutSession(_engine(model))
    with pytest.raises(RuntimeError, match="outside"):
        session.generate([[5]], SamplingParams())


def test_sync_weights_state_dict_changes_samples_to_new_policy(
    prompts: list[list[int]],
) -> None:
    policy, other = conformance_model(0), conformance_model(1)
    sampling = SamplingParams(max_new_tokens=8, greedy=True)
    engine = _engine(policy)
    before = engine.generate(prompts, sampling)
    assert {c.policy_version for r in before for c in r} == {0}
    engine.sync_weights(policy, version=1)  # the shared module: nothing to copy
    again = engine.generate(prompts, sampling)
    assert tokens(again) == tokens(before)
    assert {c.policy_version for r in again for c in r} == {1}
    engine.sync_weights(other.state_dict(), version=2)
    expected = _engine(other).generate(prompts, sampling)
    after = engine.generate(prompts, sampling)
    assert tokens(after) == tokens(expected)
    assert {c.policy_version for r in after for c in r} == {2}
    with pytest.raises(ValueError, match="not in the policy"):
        engine.sync_weights({"no.such.weight": torch.zeros(1)}, version=3)


def test_attn_backend_flash_without_gpu_falls_back_with_one_warning(
    model: Qwen3ForCausalLM, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(log, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="areno"):
        first = NativeEngine(model, [EOS], EngineOptions(attn_backend="flash"))
        NativeEngine(model, [EOS], EngineOptions(attn_backend="flash", eager_decode=True))
    warnings = [r for r in caplog.records if "flash" in r.getMessage()]
    assert len(warnings) == 1
    assert first.attn_implementation == "sdpa"
    out = first.generate([[5, 6]], SamplingParams(max_new_tokens=3, greedy=True))
    assert len(out[0][0].token_ids) > 0


def test_engine_options_invalid_values_raise_value_error() -> None:
    with pytest.raises(ValueError, match="--max-running must be >= 1, got 0"):
        EngineOptions(max_running=0)
    with pytest.raises(ValueError, match="--attn-backend must be one of flash, native"):
        EngineOptions(attn_backend="triton")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--max-prompt-tokens must be >= 1, got 0"):
        EngineOptions(max_prompt_tokens=0)
    with pytest.raises(ValueError, match="--prefill-batch-tokens must be >= 1, got 0"):
        NativeEngineConfig(prefill_batch_tokens=0)


def test_create_native_engine_with_tokenizer_decodes_text_and_uses_its_eos(
    model: Qwen3ForCausalLM,
) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="t0"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=f"t{EOS}")
    engine = create_native_engine(model, tokenizer, EngineOptions(attn_backend="native"))
    assert isinstance(engine, RolloutEngine)
    assert EOS in engine.eos_token_ids
    out = engine.generate([[5, 6, 7], [20]], SamplingParams(max_new_tokens=16, greedy=True))
    for group in out:
        c = group[0]
        body = c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids
        assert c.text == tokenizer.decode(list(body))


def test_generate_cache_grows_no_further_than_the_remaining_token_budget(
    model: Qwen3ForCausalLM,
) -> None:
    engine = _engine(model)
    prompts = [[3 + (i + j) % 50 for j in range(20)] for i in range(8)]
    sampling = SamplingParams(max_new_tokens=40, greedy=True)
    out = engine.generate(prompts, sampling)
    store = engine._store
    assert store is not None
    # Every prompt was admitted at once, so growth stops at the 20 prompt columns plus the
    # 40-token budget (64-column rounding alone would give 128 columns).
    assert 20 + 1 <= store.cols <= 20 + 40
    # Admitting in waves (prompts still waiting) keeps slack, and gives the same tokens.
    waves = _engine(model, max_running=3).generate(prompts, sampling)
    assert tokens(waves) == tokens(out)


def test_generate_prompt_offset_makes_a_split_batch_sample_like_one_call(
    model: Qwen3ForCausalLM, prompts: list[list[int]]
) -> None:
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)
    whole = _engine(model).generate(prompts, sampling, n=3)
    head = _engine(model).generate(prompts[:3], sampling, n=3)
    tail = _engine(model).generate(prompts[3:], attrs.evolve(sampling, prompt_offset=3), n=3)
    assert tokens(head) + tokens(tail) == tokens(whole)
    unshifted = _engine(model).generate(prompts[3:], sampling, n=3)
    assert tokens(unshifted) != tokens(whole)[3:]


def test_sampling_negative_prompt_offset_is_refused(model: Qwen3ForCausalLM) -> None:
    with pytest.raises(ValueError, match="prompt_offset must be >= 0, got -1"):
        _engine(model).generate([[5, 6]], SamplingParams(seed=1, prompt_offset=-1))


def test_probe_memory_builds_the_cache_of_a_whole_row_without_touching_stats(
    model: Qwen3ForCausalLM,
) -> None:
    engine = _engine(model, shared_prompt_cache=False)
    with RolloutSession(engine, drop_state=False):
        before = dict(engine.stats)
        engine.probe_memory(
            12, prompt_tokens=10, context_tokens=300, sampling=SamplingParams(top_p=0.9), n=4
        )
        assert engine.stats == before
    store = engine._store
    assert store is not None and (store.rows, store.cols) == (12, 300)
    # 12 rows x 300 columns x 2 layers x (keys, values) x 2 kv heads x 16 dims x 4 bytes,
    # plus the 12 x 300 boolean mask.
    assert engine.state_bytes == 12 * 300 * 2 * 2 * 2 * 16 * 4 + 12 * 300
    # Shared prompts: the rows hold the 290 other columns, and the 3 prompts (4 samples each)
    # sit once each in 16-column groups (keys, values and validity mask).
    shared = _engine(model)
    shared.probe_memory(
        12, prompt_tokens=10, context_tokens=300, sampling=SamplingParams(top_p=0.9), n=4
    )
    rows_bytes = 12 * 290 * 2 * 2 * 2 * 16 * 4 + 12 * 290
    assert shared.state_bytes == rows_bytes + 3 * 16 * 2 * 2 * 2 * 16 * 4 + 3 * 16
    assert engine.options.max_running is None  # the probe's concurrency was temporary
    with pytest.raises(ValueError, match="must be >= 1"):
        engine.probe_memory(0, prompt_tokens=10, context_tokens=300, sampling=SamplingParams())


def test_generate_keeps_cudnn_attention_off_on_a_gpu(
    model: Qwen3ForCausalLM, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from areno_core.accel import attention
    from areno_core.rollout import native

    seen: list[bool] = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(*args: object, **kwargs: object) -> torch.Tensor:
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    # The switch as it acts on a GPU (on a CPU it leaves the flag alone).
    monkeypatch.setattr(
        native, "sdpa_without_cudnn", lambda device: attention.sdpa_without_cudnn("cuda")
    )
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        _engine(model).generate(prompts[:2], SamplingParams(max_new_tokens=4, greedy=True))
        assert seen and not any(seen)
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)

"""The conformance suite every rollout engine passes, written once for all engines.

An engine plugin (areno's ``native`` engine, ``areno-sglang``, a third party's) runs the suite
by subclassing :class:`EngineConformance` in one of its test modules and providing the
``engine_factory`` fixture::

    import pytest
    from areno_core.engine_conformance import EngineConformance


    class TestMyEngine(EngineConformance):
        @pytest.fixture
        def engine_factory(self):
            def make(model, eos_token_ids, options):
                return MyEngine(model, eos_token_ids, options)

            return make

``make(model, eos_token_ids, options)`` returns an engine that ends completions at
``eos_token_ids`` (a list of ints; completions then carry no text) and honours ``options`` (the
core's :class:`~areno_core.contracts.engine.EngineOptions`). ``model`` is a tiny random Qwen3 on the
CPU; the engine may sample from it directly or from its own copy: the suite calls
``sync_weights(model, version=0)`` before the first ``generate``, as a run does. An engine
with a ``close()`` method is closed after each test.

What the suite checks, against the native engine and a teacher-forced forward of the model:

- greedy decoding gives the native engine's tokens and finish reasons, token for token;
- every logprob is ``log_softmax(logits / temperature)`` at the sampled token, taken before
  top-k/top-p (temperature 1 when greedy), within ``1e-4``;
- ``n`` samples per prompt, each with as many logprobs as tokens and the prompt it came from;
- an EOS or a stop token ends a completion (included, reason ``stop``), ``max_new_tokens``
  ends it with reason ``length``; top-k 1 samples what greedy picks;
- a prompt over ``max_prompt_tokens`` gets no completion and is counted in
  ``stats["skipped_prompts"]``; ``stats`` holds the counters every engine keeps and a session
  resets them;
- ``sync_weights(weights, version=v)`` makes the engine sample from ``weights`` (a module or a
  state dict) and stamps every later completion with ``policy_version == v``;
- the same ``sampling.seed`` repeats the same samples (skipped when the class sets
  ``seeded_samples_repeat = False``, for engines whose sampler takes no seed);
- the lifecycle (:mod:`areno_core.contracts.engine`): after ``sync_weights`` the engine holds its
  weights; a session that ends with ``drop_state`` either keeps them (then the next session
  samples exactly what the last one did) or, only for an engine that declares
  ``drops_weights``, reports ``holds_weights == False`` and refuses to generate
  (:class:`~areno_core.contracts.engine.WeightsNotHeldError`) until the same version is pushed
  again, after which it samples the policy's tokens, stamped with that version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from areno_core.contracts.engine import (
    EngineOptions,
    RolloutEngine,
    RolloutSession,
    WeightsNotHeldError,
    drops_weights,
    holds_weights,
)
from areno_core.rollout.kit import GENERATION_STAT_KEYS
from areno_core.rollout.native import NativeEngine
from areno_core.runner.rollout import RolloutRunner
from areno_core.types import Completion, SamplingParams

EOS = 3
"""The EOS token id of the conformance model."""
VOCAB = 97
PROMPT_LENGTHS = (3, 9, 1, 5, 2, 7, 12, 4)
"""Prompt lengths of :func:`conformance_prompts`: rows of very different lengths share a
batch."""
STAT_KEYS = tuple(k for k in GENERATION_STAT_KEYS if k != "tokens_per_s")
"""The statistics every engine keeps (:mod:`areno_core.rollout.kit`)."""
"""Counters every engine keeps in ``stats``."""

TINY_SIZES: dict[str, int] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
"""The sizes of :func:`conformance_model`, for tests that build other families alike."""

EngineFactory = Callable[[torch.nn.Module, list[int], EngineOptions], RolloutEngine]


def conformance_model(seed: int = 0) -> torch.nn.Module:
    """A tiny random Qwen3 (97 tokens, 2 layers) on which greedy decoding ends some of
    :func:`conformance_prompts` at EOS within 16 tokens and runs others to the length cap."""

    torch.manual_seed(seed)
    config = Qwen3Config(
        **TINY_SIZES,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 3.0  # makes EOS the greedy pick after some prompts
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    return model.eval()


def conformance_prompts() -> list[list[int]]:
    """Eight prompts of :data:`PROMPT_LENGTHS` tokens (ids 4..96, so none is EOS)."""
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def native_reference(model: torch.nn.Module, **options: Any) -> RolloutEngine:
    """The native engine over ``model``: the reference every engine is compared with."""

    return NativeEngine(model, [EOS], EngineOptions(attn_backend="native", **options))


def teacher_forced_logprobs(
    model: torch.nn.Module, completion: Completion, temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` of ``model`` at each completion token, scored in one
    forward pass over prompt + completion (on the model's device; the result is on the CPU)."""
    device = next(model.parameters()).device
    ids = torch.tensor([completion.prompt_ids + completion.token_ids], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float().cpu()
    start = len(completion.prompt_ids)
    logprobs = (logits[start - 1 : -1] / temperature).log_softmax(-1)
    return logprobs.gather(-1, torch.tensor(completion.token_ids).unsqueeze(-1)).squeeze(-1)


def tokens(groups: list[list[Completion]]) -> list[list[tuple[int, ...]]]:
    return [[c.token_ids for c in group] for group in groups]


class EngineConformance:
    """Base class of an engine's conformance tests (see the module docstring)."""

    seeded_samples_repeat: bool = True
    """Whether the same ``sampling.seed`` must repeat the same samples."""

    @pytest.fixture
    def engine_factory(self) -> EngineFactory:
        raise NotImplementedError("a conformance test class must define the engine_factory fixture")

    @pytest.fixture(scope="class")
    @classmethod
    def model(cls) -> torch.nn.Module:
        return conformance_model()

    @pytest.fixture(scope="class")
    @classmethod
    def prompts(cls) -> list[list[int]]:
        return conformance_prompts()

    @pytest.fixture
    def make(self, engine_factory: EngineFactory) -> Iterator[Callable[..., RolloutEngine]]:
        """``make(model, **engine_options)``: an engine synced to ``model`` at version 0."""
        made: list[RolloutEngine] = []

        def build(model: torch.nn.Module, **options: Any) -> RolloutEngine:
            engine = engine_factory(model, [EOS], EngineOptions(attn_backend="native", **options))
            made.append(engine)
            engine.sync_weights(model, version=0)
            return engine

        yield build
        for engine in made:
            close = getattr(engine, "close", None)
            if callable(close):
                close()

    # -- decoding ----------------------------------------------------------------------------

    def test_conformance_greedy_matches_native_engine_token_for_token(self, make, model, prompts):
        sampling = SamplingParams(max_new_tokens=16, greedy=True)
        engine = make(model)
        out = engine.generate(prompts, sampling)
        expected = native_reference(model).generate(prompts, sampling)
        assert tokens(out) == tokens(expected)
        assert [g[0].finish_reason for g in out] == [g[0].finish_reason for g in expected]
        assert {g[0].finish_reason for g in out} == {"stop", "length"}
        for prompt, group in zip(prompts, out, strict=True):
            assert group[0].prompt_ids == tuple(prompt)

    @pytest.mark.parametrize(
        "sampling",
        [
            SamplingParams(max_new_tokens=12, temperature=0.7, seed=5),
            SamplingParams(max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.8, seed=5),
            SamplingParams(max_new_tokens=12, greedy=True, temperature=0.7),
        ],
        ids=["temperature", "top-k-top-p", "greedy"],
    )
    def test_conformance_logprobs_match_teacher_forced_forward(
        self, make, model, prompts, sampling
    ):
        out = make(model, max_running=3).generate(prompts, sampling, n=2)
        temperature = 1.0 if sampling.greedy else sampling.temperature
        for group in out:
            for completion in group:
                expected = teacher_forced_logprobs(model, completion, temperature)
                got = torch.tensor(completion.logprobs)
                torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-4)

    def test_conformance_n_samples_give_n_completions_per_prompt(self, make, model, prompts):
        sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
        out = make(model).generate(prompts[:3], sampling, n=4)
        assert [len(group) for group in out] == [4, 4, 4]
        for prompt, group in zip(prompts[:3], out, strict=True):
            for completion in group:
                assert completion.prompt_ids == tuple(prompt)
                assert 1 <= len(completion.token_ids) <= 6
                assert len(completion.logprobs) == len(completion.token_ids)
                assert all(lp <= 0.0 for lp in completion.logprobs)
        assert len({c.token_ids for c in out[1]}) > 1  # samples of one prompt differ

    def test_conformance_same_seed_repeats_samples(self, make, model, prompts):
        if not self.seeded_samples_repeat:
            pytest.skip("this engine's sampler takes no seed")
        engine = make(model)
        sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)
        first = engine.generate(prompts[:3], sampling, n=3)
        again = engine.generate(prompts[:3], sampling, n=3)
        other = engine.generate(prompts[:3], SamplingParams(max_new_tokens=8, seed=8), n=3)
        assert tokens(again) == tokens(first)
        assert tokens(other) != tokens(first)

    def test_conformance_eos_ends_with_stop_and_the_cap_with_length(self, make, model, prompts):
        out = make(model).generate(prompts, SamplingParams(max_new_tokens=16, greedy=True))
        for group in out:
            completion = group[0]
            assert EOS not in completion.token_ids[:-1]
            if completion.finish_reason == "stop":
                assert completion.token_ids[-1] == EOS
            else:
                assert completion.finish_reason == "length"
                assert len(completion.token_ids) == 16
            assert completion.text == ""

    def test_conformance_stop_token_ids_end_a_completion_like_eos(self, make, model):
        prompt = [[10, 11, 12]]
        engine = make(model)
        plain = engine.generate(prompt, SamplingParams(max_new_tokens=16, greedy=True))[0][0]
        stop_at = plain.token_ids[2]
        stopped = engine.generate(
            prompt, SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=(stop_at,))
        )[0][0]
        assert stopped.token_ids == plain.token_ids[: plain.token_ids.index(stop_at) + 1]
        assert stopped.finish_reason == "stop"

    def test_conformance_top_k_one_samples_the_greedy_tokens(self, make, model, prompts):
        engine = make(model)
        greedy = engine.generate(prompts, SamplingParams(max_new_tokens=10, greedy=True))
        top1 = engine.generate(
            prompts, SamplingParams(max_new_tokens=10, temperature=1.3, top_k=1, seed=2)
        )
        assert tokens(top1) == tokens(greedy)

    # -- prompts, stats and sessions ---------------------------------------------------------

    def test_conformance_long_prompt_is_skipped_and_counted(self, make, model, prompts):
        engine = make(model, max_prompt_tokens=6)
        with RolloutSession(engine):
            out = engine.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True), n=2)
        too_long = [len(p) > 6 for p in prompts]
        assert [len(group) == 0 for group in out] == too_long
        assert all(len(g) == 2 for g, skip in zip(out, too_long, strict=True) if not skip)
        stats = engine.stats
        assert stats["prompts"] == len(prompts)
        assert stats["skipped_prompts"] == sum(too_long)
        assert stats["completions"] == 2 * (len(prompts) - sum(too_long))
        assert stats["generated_tokens"] == sum(len(c.token_ids) for g in out for c in g)
        kept = [p for p, skip in zip(prompts, too_long, strict=True) if not skip]
        assert stats["prompt_tokens"] == 2 * sum(len(p) for p in kept)

    def test_conformance_all_prompts_skipped_gives_empty_lists(self, make, model):
        engine = make(model, max_prompt_tokens=2)
        assert engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=4)) == [[]]
        assert engine.stats["skipped_prompts"] == 1

    def test_conformance_session_resets_the_stats(self, make, model, prompts):
        engine = make(model)
        assert set(STAT_KEYS) <= set(engine.stats)
        sampling = SamplingParams(max_new_tokens=3, greedy=True)
        with RolloutSession(engine) as session:
            session.generate(prompts[:2], sampling)
        assert engine.stats["prompts"] == 2
        if not holds_weights(engine):  # released with its session: pushed again, as a run does
            engine.sync_weights(model, version=0)
        with RolloutSession(engine, drop_state=True) as session:
            assert engine.stats["prompts"] == 0
            session.generate(prompts[:3], sampling)
        assert engine.stats["prompts"] == 3

    # -- weights -----------------------------------------------------------------------------

    def test_conformance_sync_weights_sets_the_version_and_the_weights(self, make, prompts):
        policy = conformance_model(0)
        sampling = SamplingParams(max_new_tokens=8, greedy=True)
        engine = make(policy)
        before = engine.generate(prompts, sampling)
        assert engine.policy_version == 0
        assert {c.policy_version for g in before for c in g} == {0}

        other = conformance_model(1)
        expected = native_reference(other).generate(prompts, sampling)
        assert tokens(expected) != tokens(before)
        engine.sync_weights(other.state_dict(), version=2)
        assert engine.policy_version == 2
        after = engine.generate(prompts, sampling)
        assert tokens(after) == tokens(expected)
        assert {c.policy_version for g in after for c in g} == {2}

        # Back to the first weights, as a module of its own (an engine may have copied the
        # state dict into ``policy`` itself).
        engine.sync_weights(conformance_model(0), version=3)
        again = engine.generate(prompts, sampling)
        assert tokens(again) == tokens(before)
        assert {c.policy_version for g in again for c in g} == {3}
        assert engine.stats["weight_syncs"] >= 3

    # -- lifecycle ---------------------------------------------------------------------------

    def test_conformance_release_keeps_the_weights_or_says_it_dropped_them(
        self, make, model, prompts
    ):
        sampling = SamplingParams(max_new_tokens=8, greedy=True)
        engine = make(model)
        assert holds_weights(engine)
        with RolloutSession(engine) as session:
            before = session.generate(prompts, sampling)
        for _ in range(2):  # twice: a second release must not lose more than the first
            with RolloutSession(engine, drop_state=True) as session:
                if not holds_weights(engine):
                    assert drops_weights(engine), (
                        "the engine lost its weights in a release but does not declare "
                        "drops_weights, so no runner would push them again"
                    )
                    with pytest.raises(WeightsNotHeldError):
                        session.generate(prompts, sampling)
                    engine.sync_weights(model, version=0)  # what the runner does
                    assert holds_weights(engine)
                again = session.generate(prompts, sampling)
            assert tokens(again) == tokens(before)
            assert {c.policy_version for g in again for c in g} == {0}

    def test_conformance_runner_pushes_weights_again_after_an_evaluation_released_them(
        self, make, model, prompts
    ):
        # The sequence every run with evaluation goes through: sync(v) -> an evaluation
        # session that frees state -> the next rollout at the same version.
        from types import SimpleNamespace

        sampling = SamplingParams(max_new_tokens=8, greedy=True)
        expected = native_reference(model).generate(prompts, sampling)
        engine = make(model)
        owner = SimpleNamespace(optimizer_steps=0, policy=model, adapter=None)
        runner = RolloutRunner(
            owner,  # type: ignore[arg-type]
            engine,
            sampling=sampling,
            n_samples=1,
            reward_fn=lambda record: 0.0,
            batch_size=len(prompts),
        )
        runner.sync_weights()
        with RolloutSession(engine, drop_state=True) as session:  # the evaluation
            session.generate(prompts[:2], sampling)
        runner.sync_weights()  # the loop's call between steps: the version did not move
        with RolloutSession(engine) as session:  # the next rollout
            out = session.generate(prompts, sampling)
        assert tokens(out) == tokens(expected)
        assert {c.policy_version for g in out for c in g} == {0}
        assert runner.weight_restores == (1 if drops_weights(engine) else 0)


__all__ = [
    "EOS",
    "PROMPT_LENGTHS",
    "STAT_KEYS",
    "TINY_SIZES",
    "VOCAB",
    "EngineConformance",
    "conformance_model",
    "conformance_prompts",
    "native_reference",
    "teacher_forced_logprobs",
    "tokens",
]

"""A real SGLang server in colocated mode (needs the sglang package and a CUDA GPU).

Skipped, with the reason, where either is missing: CI has neither. The model is a tiny random
Qwen3 in float32 with head_dim 64, served with SGLang's torch-native attention and without
CUDA graphs, so SGLang's numbers stay close to the trainer's.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from areno_sglang.config import SGLangEngineConfig
from areno_sglang.engine import SGLangEngine

from areno_core.contracts.engine import EngineOptions, RolloutSession
from areno_core.engine_conformance import EOS, conformance_prompts, teacher_forced_logprobs
from areno_core.rollout.native import NativeEngine
from areno_core.types import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu() -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (pip install areno-sglang, without --no-deps)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: colocated SGLang runs on the training GPU")


def _model(seed: int) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 3.0
    model.generation_config.eos_token_id = EOS
    return model.cuda().eval()


def test_real_sglang_colocated_samples_the_pushed_weights_and_shares_the_gpu(gpu):
    policy = _model(0)
    config = SGLangEngineConfig(
        sglang_mode="colocated",
        sglang_mem_fraction=0.3,
        sglang_server_args="--dtype float32 --attention-backend torch_native --disable-cuda-graph",
    )
    engine = SGLangEngine(policy, [EOS], EngineOptions(), config, dp_rank=0, dp_size=1)
    try:
        prompts = conformance_prompts()
        greedy = SamplingParams(max_new_tokens=12, greedy=True)
        engine.sync_weights(policy, version=0)
        with RolloutSession(engine):
            out = engine.generate(prompts, greedy)
            sampled = engine.generate(
                prompts, SamplingParams(max_new_tokens=12, temperature=0.7, seed=1), n=2
            )
        native = NativeEngine(policy, [EOS], EngineOptions(attn_backend="native"))
        expected = native.generate(prompts, greedy)
        same = sum(a[0].token_ids == b[0].token_ids for a, b in zip(out, expected, strict=True))
        assert same >= len(prompts) - 1, "greedy tokens differ from the trainer's model"
        for group in sampled:
            for completion in group:
                reference = teacher_forced_logprobs(policy, completion, 0.7)
                got = torch.tensor(completion.logprobs)
                torch.testing.assert_close(got, reference, rtol=0.0, atol=1e-2)
        other = _model(1)
        engine.sync_weights(other, version=1)  # resumes the released memory, then pushes
        with RolloutSession(engine):
            after = engine.generate(prompts, greedy)
        assert {c.policy_version for g in after for c in g} == {1}
        assert [g[0].token_ids for g in after] != [g[0].token_ids for g in out]
    finally:
        engine.close()

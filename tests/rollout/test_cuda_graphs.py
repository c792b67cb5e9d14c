"""Decode steps from captured CUDA graphs: the bucket and graph bookkeeping, and the static
decode step they replay (run without capture on a CPU, captured on a GPU)."""

from __future__ import annotations

import pytest
import torch

from areno_core.contracts.engine import EngineOptions
from areno_core.engine_conformance import EOS, conformance_model, conformance_prompts
from areno_core.rollout.cuda_graphs import (
    DEFAULT_BUCKETS,
    DecodeGraphs,
    bucket_for,
    bucket_sizes,
)
from areno_core.rollout.native import NativeEngine, NativeEngineConfig
from areno_core.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = (1, 2, 4, 8)


def _engine(model: torch.nn.Module, **options: object) -> NativeEngine:
    return NativeEngine(
        model,
        [EOS],
        EngineOptions(attn_backend="native", **options),  # type: ignore[arg-type]
        NativeEngineConfig(),
    )


@pytest.fixture(scope="module")
def model():
    return conformance_model()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return conformance_prompts()


# -- buckets ------------------------------------------------------------------------------------


def test_bucket_sizes_add_the_capacity_unless_above_the_largest():
    assert bucket_sizes(6, SMALL) == (1, 2, 4, 6)
    assert bucket_sizes(8, SMALL) == (1, 2, 4, 8)
    assert bucket_sizes(1, SMALL) == (1,)
    assert bucket_sizes(20, SMALL) == (1, 2, 4, 8)  # 9..20 running rows decode eagerly
    assert bucket_sizes(1000)[-1] == max(DEFAULT_BUCKETS) == 512


@pytest.mark.parametrize(
    ("running", "capacity", "expected"),
    [(1, 8, 1), (3, 8, 4), (5, 8, 8), (5, 6, 6), (8, 20, 8), (9, 20, None), (20, 20, None)],
)
def test_bucket_for_picks_the_smallest_size_that_holds_the_rows(running, capacity, expected):
    assert bucket_for(running, capacity, SMALL) == expected


def test_bucket_for_rejects_impossible_row_counts():
    with pytest.raises(ValueError, match=r"running rows must be in \[1, 4\], got 5"):
        bucket_for(5, 4, SMALL)
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        bucket_sizes(0)


# -- graph bookkeeping --------------------------------------------------------------------------


class CountingForward:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, bucket: int) -> torch.Tensor:
        self.calls.append(bucket)
        return torch.full((bucket, 3), float(len(self.calls)))


def test_graphs_record_each_size_once_and_replay_it():
    graphs = DecodeGraphs(capture=False, buckets=SMALL)
    forward = CountingForward()
    out = graphs.step("k", running=3, capacity=8, forward=forward)
    assert out is not None and out.shape == (4, 3)
    graphs.step("k", running=4, capacity=8, forward=forward)
    graphs.step("k", running=1, capacity=8, forward=forward)
    assert graphs.captured_sizes == (1, 4)
    assert (graphs.stats.captures, graphs.stats.replays, graphs.stats.resets) == (2, 3, 0)
    assert forward.calls == [4, 4, 1]  # without capture every replay runs the static step


def test_graphs_are_dropped_when_the_key_changes():
    graphs = DecodeGraphs(capture=False, buckets=SMALL)
    forward = CountingForward()
    graphs.step(("store", 1), 2, 8, forward)
    graphs.step(("store", 1), 3, 8, forward)
    graphs.step(("store", 2), 3, 8, forward)  # buffers reallocated: recapture
    assert graphs.captured_sizes == (4,)
    assert (graphs.stats.captures, graphs.stats.resets) == (3, 1)
    graphs.reset()
    assert graphs.captured_sizes == ()


def test_graphs_decline_rows_above_every_size():
    graphs = DecodeGraphs(capture=False, buckets=SMALL)
    forward = CountingForward()
    assert graphs.step("k", running=9, capacity=16, forward=forward) is None
    assert forward.calls == [] and graphs.stats.replays == 0


def test_graphs_need_positive_sizes():
    with pytest.raises(ValueError, match="buckets must be positive"):
        DecodeGraphs(capture=False, buckets=(0, 4))


# -- the static decode step in the native engine -----------------------------------------------


def _static_engine(model, **options) -> NativeEngine:
    engine = _engine(model, **options)
    engine._graphs = DecodeGraphs(capture=False, buckets=SMALL)
    return engine


def _flat(results):
    tokens = [c.token_ids for r in results for c in r]
    logprobs = torch.tensor([x for r in results for c in r for x in c.logprobs])
    return tokens, logprobs


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("max_running", [3, 5])
def test_static_decode_samples_what_eager_decode_samples(model, prompts, greedy, max_running):
    """Continuous batching with rows finishing, closing and being refilled, the window moving
    and the cache growing: the static step (what a graph replays) matches the eager one."""
    sampling = SamplingParams(max_new_tokens=24, greedy=greedy, seed=7)
    eager = _engine(model, max_running=max_running)
    static = _static_engine(model, max_running=max_running)
    expected_tokens, expected_logprobs = _flat(eager.generate(prompts, sampling, n=3))
    tokens, logprobs = _flat(static.generate(prompts, sampling, n=3))
    assert tokens == expected_tokens
    torch.testing.assert_close(logprobs, expected_logprobs, atol=1e-5, rtol=0.0)
    stats = static.stats
    assert stats["graph_decode_steps"] == stats["decode_steps"] > 0  # every step fit a size
    graphs = static._graphs
    assert stats["graph_captures"] == graphs.stats.captures >= 1
    assert set(graphs.captured_sizes) <= set(bucket_sizes(max_running, SMALL))


def test_static_decode_runs_only_where_rows_fit_a_size(model, prompts):
    sampling = SamplingParams(max_new_tokens=20, greedy=True)
    static = _static_engine(model)  # 24 rows at once: eager until at most 8 are left
    eager = _engine(model)
    assert (
        _flat(static.generate(prompts, sampling, n=3))[0]
        == _flat(eager.generate(prompts, sampling, n=3))[0]
    )
    assert 0 < static.stats["graph_decode_steps"] < static.stats["decode_steps"]


def test_static_decode_recaptures_after_the_weights_move(model, prompts):
    engine = _static_engine(conformance_model(), max_running=4)
    sampling = SamplingParams(max_new_tokens=6, greedy=True)
    engine.generate(prompts[:2], sampling)
    graphs = engine._graphs
    assert graphs is not None and graphs.stats.captures > 0 and graphs.stats.resets == 0
    engine.model.to(torch.float64).to(torch.float32)  # new tensors: new addresses
    engine.generate(prompts[:2], sampling)
    assert graphs.stats.resets == 1


def test_drop_state_drops_the_graphs(model, prompts):
    engine = _static_engine(model, max_running=4)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=6, greedy=True))
    assert engine._graphs.captured_sizes != ()
    engine.drop_state()
    assert engine._graphs.captured_sizes == () and engine.state_bytes == 0


def test_no_graphs_on_cpu_or_with_eager_decode(model, prompts):
    sampling = SamplingParams(max_new_tokens=4, greedy=True)
    for eager_decode in (False, True):
        engine = _engine(model, max_running=4, eager_decode=eager_decode)
        engine.generate(prompts[:2], sampling)
        assert engine._graphs is None and engine.stats["graph_decode_steps"] == 0


# -- on a GPU -----------------------------------------------------------------------------------


def _cuda_engine(model, *, eager_decode: bool, max_running: int) -> NativeEngine:
    return NativeEngine(
        model, [EOS], EngineOptions(attn_backend="native", eager_decode=eager_decode,
                                  max_running=max_running),
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_decode_graphs_match_eager_decode_on_gpu(prompts, dtype):
    model = conformance_model().to("cuda", dtype)
    sampling = SamplingParams(max_new_tokens=24, greedy=True, seed=3)
    eager = _cuda_engine(model, eager_decode=True, max_running=5)
    graphs = _cuda_engine(model, eager_decode=False, max_running=5)
    expected_tokens, expected_logprobs = _flat(eager.generate(prompts, sampling, n=3))
    tokens, logprobs = _flat(graphs.generate(prompts, sampling, n=3))
    assert graphs._graphs is not None and graphs._graphs.capture
    assert graphs.stats["graph_captures"] >= 1
    assert graphs.stats["graph_decode_steps"] == graphs.stats["decode_steps"]
    assert eager.stats["graph_decode_steps"] == 0
    atol = 1e-4 if dtype == torch.float32 else 5e-2
    if dtype == torch.float32:
        assert tokens == expected_tokens
    else:  # bfloat16 ties may break differently over a different kernel; most tokens agree
        same = sum(a == b for a, b in zip(tokens, expected_tokens, strict=True))
        assert same >= 0.8 * len(tokens)
        return
    torch.testing.assert_close(logprobs, expected_logprobs, atol=atol, rtol=0.0)

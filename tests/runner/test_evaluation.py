"""build_evaluator: one greedy completion per row, scored by the reward, reduced to eval/*."""

from __future__ import annotations

import pytest

from areno_core.models.tokenizer import build_byte_tokenizer
from areno_core.runner.evaluation import build_evaluator
from areno_core.types import Completion


class ScriptedEngine:
    """Returns fixed completions per prompt and records how it was called."""

    def __init__(self, texts: list[str], reasons: list[str]) -> None:
        self.texts, self.reasons = texts, reasons
        self.calls: list[tuple[int, bool, int, int]] = []
        self.sessions = 0

    def start_session(self) -> None:
        self.sessions += 1

    def end_session(self, drop_state: bool = False) -> None:
        assert drop_state

    def generate(self, prompts, sampling, n=1, generator=None):
        self.calls.append((len(prompts), sampling.greedy, n, sampling.max_new_tokens))
        return [
            [Completion(tuple(p), tuple(range(len(t))), (0.0,) * len(t), t, reason)]
            for p, t, reason in zip(prompts, self.texts, self.reasons, strict=True)
        ]


def test_evaluator_greedy_one_sample_metrics_hand_computed() -> None:
    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in (1, 2, 3, 4)]
    # right, wrong, right, truncated-wrong
    engine = ScriptedEngine(["2", "4", "4", "99999"], ["stop", "stop", "stop", "length"])

    def reward(record) -> float:
        return 1.0 if record.completion == record.answer else 0.25

    evaluate = build_evaluator(
        rows, engine=engine, tokenizer=build_byte_tokenizer(), reward_fn=reward, max_new_tokens=5
    )
    metrics = evaluate()
    assert engine.calls == [(4, True, 1, 5)]
    assert metrics["eval/accuracy"] == pytest.approx(2 / 4)
    assert metrics["eval/reward_mean"] == pytest.approx((1 + 0.25 + 1 + 0.25) / 4)
    assert metrics["eval/response_length_mean"] == pytest.approx((1 + 1 + 1 + 5) / 4)
    assert metrics["eval/truncation_rate"] == pytest.approx(1 / 4)
    assert metrics["time/eval"] >= 0.0
    assert set(metrics) == {
        "eval/accuracy", "eval/reward_mean", "eval/response_length_mean",
        "eval/truncation_rate", "eval/skipped_rows", "time/eval",
    }  # fmt: skip
    assert metrics["eval/skipped_rows"] == 0.0
    evaluate()
    assert engine.sessions == 2 and len(engine.calls) == 2  # every call evaluates afresh


def test_evaluator_prompts_the_engine_skips_are_counted_not_scored() -> None:
    class SkippingEngine(ScriptedEngine):
        def generate(self, prompts, sampling, n=1, generator=None):
            out = super().generate(prompts, sampling, n, generator)
            return [[] if i % 2 else samples for i, samples in enumerate(out)]  # too long

    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in (1, 2, 3, 4)]
    engine = SkippingEngine(["2", "3", "5", "5"], ["stop"] * 4)
    evaluate = build_evaluator(
        rows,
        engine=engine,
        tokenizer=build_byte_tokenizer(),
        reward_fn=lambda r: float(r.completion == r.answer),
        max_new_tokens=5,
    )
    metrics = evaluate()
    assert metrics["eval/skipped_rows"] == 2.0
    assert metrics["eval/accuracy"] == pytest.approx(1 / 2)  # rows 0 and 2: right, wrong

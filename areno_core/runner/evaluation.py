"""Held-out evaluation during online RL: greedy completions scored by the run's reward.

``--eval-dataset-path`` rows go through the run's loader like training rows; each prompt gets
one greedy completion, and the reward function scores it. The loop calls the evaluator before
the first step, every ``--eval-interval`` steps and after the last, and logs:

    eval/accuracy               share of prompts whose reward is at least 1
    eval/reward_mean            mean reward
    eval/response_length_mean   generated tokens per prompt
    eval/truncation_rate        share of completions cut by --max-new-tokens
    eval/skipped_rows           prompts not evaluated (longer than --max-prompt-tokens); the
                                other metrics are over the rest
    time/eval                   seconds spent evaluating

Greedy decoding draws no random numbers, so evaluating does not change what the run samples
and a resumed run stays identical to an uninterrupted one. When training spans several
processes, each evaluates a block of the prompts and the metrics cover all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from areno_core.contracts.engine import RolloutSession
from areno_core.rewards import RewardScorer
from areno_core.rollout.collect import collect_groups, prompt_item
from areno_core.types import SamplingParams

if TYPE_CHECKING:
    from areno_core.rollout.placement import RolloutPlacement

# rollout/* statistics of the greedy pass, under the names they are logged as.
EVAL_METRICS = {
    "rollout/accuracy": "eval/accuracy",
    "rollout/reward_mean": "eval/reward_mean",
    "rollout/response_length_mean": "eval/response_length_mean",
    "rollout/truncation_rate": "eval/truncation_rate",
    "rollout/skipped_prompts": "eval/skipped_rows",
}


def build_evaluator(
    rows: Sequence[dict[str, Any]],
    *,
    engine: Any,
    tokenizer: Any,
    reward_fn: Callable[[Any], Any],
    max_new_tokens: int,
    disable_thinking: bool = False,
    placement: RolloutPlacement | None = None,
) -> Callable[[], dict[str, float]]:
    """A function that evaluates the engine's current weights on ``rows`` and returns the
    ``eval/*`` metrics plus ``time/eval``. With a ``placement`` of several processes, each
    evaluates its block of the rows (every process must call the function)."""
    items = [prompt_item(i, dict(row)) for i, row in enumerate(rows)]
    if placement is not None:
        start, stop = placement.share(len(items))
        items = items[start:stop]
    sampling = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    scorer = RewardScorer(reward_fn)

    def evaluate() -> dict[str, float]:
        started = time.perf_counter()
        # The evaluation batch may be larger than a training step's: free what it allocated.
        with RolloutSession(engine, drop_state=True):
            groups, stats = collect_groups(
                items,
                engine=engine,
                tokenizer=tokenizer,
                sampling=sampling,
                n_samples=1,
                scorer=scorer,
                disable_thinking=disable_thinking,
            )
        if placement is not None:
            groups, stats = placement.gather_groups(groups, stats)
        metrics = {new: stats[old] for old, new in EVAL_METRICS.items() if old in stats}
        metrics["time/eval"] = time.perf_counter() - started
        return metrics

    return evaluate

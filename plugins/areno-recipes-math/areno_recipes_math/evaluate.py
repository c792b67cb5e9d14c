"""How the math recipes are scored, and a per-sample view of a checkpoint's answers.

The pack's evaluators (:data:`EVALUATORS`, registered through ``register_evaluators``) tell
``areno eval`` how each recipe is scored: ``math/arith`` by exact match on its 500 held-out
problems, ``math/gsm8k`` by math-verify on GSM8K's test split. So

    areno eval --recipe math/arith --ckpt runs/arith-gspo/step_500

gives the held-out accuracy that training logged as ``eval/accuracy`` for that step (plus
pass@k with ``--n-samples``). This module's command shows the answers themselves and writes
accuracy curves for :mod:`areno_recipes_math.plot`:

    python -m areno_recipes_math.evaluate --ckpt runs/arith-gspo --show 10

It prints ``accuracy 0.xxx (correct/total)``; a run's ``--save-path`` stands for its newest
checkpoint. With ``--all-steps`` the checkpoint is a run's
``--save-path``: its starting checkpoint (step 0, from the run's ``config.yaml``) and every saved
``step_N`` are evaluated, and ``--curve-out FILE.json`` writes the points for
:mod:`areno_recipes_math.plot`. A sample counts as correct when the reward function
(``exact_match`` by default; ``math_verify`` for word problems) gives it at least 1.0. The
loader (``arith`` by default) turns dataset rows into prompts with answers, exactly as in
training, so any RL dataset with a registered or file loader can be evaluated the same way.
Greedy decoding makes the number deterministic for a given checkpoint and dataset. The engine
is any registered rollout engine (``--engine``, default ``native``), used through a rollout
session exactly as ``areno train`` uses it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from areno_core.evaluators import EvaluatorSpec
from areno_recipes_math.recipes import ARITH_EVAL

DEFAULT_LOADER = "arith"
DEFAULT_REWARD = "exact_match"

# What `areno eval --recipe NAME` scores; unset fields come from the recipe (its loader,
# reward and max_new_tokens), so the numbers are those training logs as eval/accuracy.
EVALUATORS = (
    EvaluatorSpec(
        "math/arith",
        "greedy exact match on the 500 held-out problems (training's eval/accuracy)",
        dataset=ARITH_EVAL,
        reward="exact_match",
    ),
    EvaluatorSpec(
        "math/gsm8k",
        "math-verify on GSM8K's test split (\\boxed{} answer against the #### value)",
        dataset="gsm8k:main:test",
        reward="math_verify",
    ),
)


@attrs.frozen
class EvalSample:
    prompt: str
    answer: str | None
    completion: str
    reward: float


@attrs.frozen
class EvalResult:
    correct: int
    total: int
    samples: tuple[EvalSample, ...]

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def resolve_checkpoint(path: str) -> str:
    """A checkpoint directory; a run's save root (with a ``latest`` file) means its newest."""
    from areno_core.recipe import resolve_resource

    path = str(resolve_resource(path))
    root = Path(path)
    latest = root / "latest"
    if latest.is_file():
        return str(root / latest.read_text().strip())
    return path


def load_eval_rows(
    dataset: str, *, loader: str | None = DEFAULT_LOADER, limit: int | None = None
) -> list[dict[str, Any]]:
    """Dataset rows after the loader (a registered name or ``file.py[:fn]``), first ``limit``."""
    from areno_core.data import apply_loader, load_rows, resolve_loader
    from areno_core.recipe import resolve_resource
    from areno_core.registry import get_registry

    rows = load_rows(str(resolve_resource(dataset)))
    if limit is not None:
        rows = rows[:limit]
    fn = resolve_loader(loader, lambda name: get_registry().get("dataset_loaders", name))
    return apply_loader(rows, fn) if fn is not None else list(rows)


def evaluate_model(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    *,
    reward_fn: Any,
    max_new_tokens: int = 8,
    max_running: int = 256,
    engine: str = "native",
    registry: Any = None,
) -> EvalResult:
    """Greedy completions of every row's prompt by the registered rollout engine ``engine``,
    scored by ``reward_fn``."""
    from areno_core.contracts.engine import EngineOptions, RolloutSession
    from areno_core.registry import get_registry
    from areno_core.rewards import RewardScorer
    from areno_core.rollout.collect import encode_items, prompt_item
    from areno_core.types import RewardRecord, SamplingParams

    registry = registry or get_registry()
    items = [prompt_item(i, dict(row)) for i, row in enumerate(rows)]
    rollout = registry.engine(engine).create(
        model, tokenizer, EngineOptions(max_running=max_running, attn_backend="native")
    )
    prompts = encode_items(items, tokenizer, disable_thinking=False)
    greedy = SamplingParams(max_new_tokens=max_new_tokens, greedy=True, seed=0)
    with RolloutSession(rollout, drop_state=True) as session:
        outputs = session.generate(prompts, greedy, n=1)
    records, texts = [], []
    for item, prompt_ids, completions in zip(items, prompts, outputs, strict=True):
        text = completions[0].text if completions else ""
        texts.append(text)
        records.append(
            RewardRecord(
                prompt=item.prompt or tokenizer.decode(prompt_ids),
                completion=text,
                answer=item.answer,
                solutions=item.solutions,
                prompt_ids=tuple(prompt_ids),
                token_ids=completions[0].token_ids if completions else (),
                finish_reason=completions[0].finish_reason if completions else "abort",
                row=item.row,
                prompt_index=item.index,
            )
        )
    rewards, _ = RewardScorer(reward_fn, fail_fraction=1.0).score(records)
    samples = tuple(
        EvalSample(r.prompt, r.answer, text, reward)
        for r, text, reward in zip(records, texts, rewards, strict=True)
    )
    return EvalResult(sum(reward >= 1.0 for reward in rewards), len(rewards), samples)


def evaluate(
    ckpt: str,
    dataset: str,
    *,
    loader: str | None = DEFAULT_LOADER,
    reward: str = DEFAULT_REWARD,
    limit: int | None = None,
    max_new_tokens: int = 8,
    device: str = "cpu",
    engine: str = "native",
) -> EvalResult:
    """Load ``ckpt`` and evaluate it on ``dataset`` (see the module docstring)."""
    import torch

    from areno_core.models.loading import load_model_and_tokenizer
    from areno_core.registry import get_registry
    from areno_core.rewards import resolve_reward_fn

    rows = load_eval_rows(dataset, loader=loader, limit=limit)
    reward_fn = resolve_reward_fn(reward, get_registry())
    model, tokenizer = load_model_and_tokenizer(resolve_checkpoint(ckpt), device=device)
    with torch.no_grad():
        return evaluate_model(
            model,
            tokenizer,
            rows,
            reward_fn=reward_fn,
            max_new_tokens=max_new_tokens,
            engine=engine,
        )


def run_checkpoints(run: str | Path) -> list[tuple[int, str]]:
    """``(step, path)`` of a run's starting checkpoint (step 0) and each saved ``step_N``."""
    import yaml

    root = Path(run)
    config = root / "config.yaml"
    if not config.is_file():
        raise FileNotFoundError(f"{root} has no config.yaml; is it a run's --save-path?")
    start = yaml.safe_load(config.read_text())["basic"]["ckpt"]
    steps = sorted(
        (int(p.name.split("_", 1)[1]), str(p))
        for p in root.glob("step_*")
        if p.is_dir() and p.name.split("_", 1)[1].isdigit()
    )
    return [(0, start), *steps]


def evaluate_run(run: str | Path, dataset: str, **options: Any) -> list[tuple[int, float]]:
    """``(step, accuracy)`` for the start and every saved checkpoint of a run, each measured by
    :func:`evaluate` with ``options`` (its keyword options: loader, reward, limit, ...)."""
    return [
        (step, evaluate(path, dataset, **options).accuracy) for step, path in run_checkpoints(run)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_math.evaluate",
        description="Greedy held-out accuracy of a checkpoint on an RL dataset.",
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint directory or run save path")
    parser.add_argument(
        "--dataset",
        default="resource:areno_recipes_math/data/arith_eval.jsonl",
        help="dataset file or reference (resource:pkg/path accepted)",
    )
    parser.add_argument("--loader", default=DEFAULT_LOADER, help="registered loader or file.py")
    parser.add_argument("--reward", default=DEFAULT_REWARD, help="registered reward or file.py")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N rows only")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engine", default="native", help="registered rollout engine")
    parser.add_argument("--show", type=int, default=0, help="print the first N samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument(
        "--all-steps", action="store_true", help="--ckpt is a run: evaluate its start and steps"
    )
    parser.add_argument("--curve-out", default=None, help="with --all-steps: write points here")
    parser.add_argument("--label", default=None, help="name of the curve in --curve-out")
    args = parser.parse_args(argv)
    out = sys.stdout
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per checkpoint is noise here
    # What to evaluate and how: the same for one checkpoint and for every step of a run.
    options: dict[str, Any] = {
        "loader": args.loader or None,
        "reward": args.reward,
        "limit": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "device": args.device,
        "engine": args.engine,
    }
    if args.all_steps:
        points = evaluate_run(args.ckpt, args.dataset, **options)
        for step, accuracy in points:
            note = "  (the run's starting checkpoint)" if step == 0 else ""
            out.write(f"step {step:>5} accuracy {accuracy:.3f}{note}\n")
        if len(points) > 1:
            (_, first), (last_step, last) = points[0], points[-1]
            out.write(
                f"held-out accuracy {first:.3f} -> {last:.3f} at step {last_step} "
                f"({100 * (last - first):+.1f} points)\n"
            )
        if args.curve_out:
            label = args.label or Path(args.ckpt).name
            path = Path(args.curve_out)
            curves = json.loads(path.read_text()) if path.is_file() else {}
            curves[label] = [[step, accuracy] for step, accuracy in points]
            path.write_text(json.dumps(curves, indent=1) + "\n")
            out.write(f"wrote {path}\n")
        return
    result = evaluate(args.ckpt, args.dataset, **options)
    if args.json:
        summary = {"accuracy": result.accuracy, "correct": result.correct, "total": result.total}
        out.write(json.dumps(summary) + "\n")
        return
    for sample in result.samples[: args.show]:
        mark = "ok " if sample.reward >= 1.0 else "bad"
        out.write(f"{mark} {sample.prompt!r} -> {sample.completion!r} (answer {sample.answer})\n")
    out.write(f"accuracy {result.accuracy:.3f} ({result.correct}/{result.total})\n")


if __name__ == "__main__":
    main()

"""GRPO step throughput: areno (native rollout + LocalBackend.train) against TRL's GRPOTrainer.

    python bench/bench_grpo.py                          # both shapes, 3 repetitions per side
    python bench/bench_grpo.py --shape tiny --reps 5
    python bench/bench_grpo.py --shape gsm8k --json runs/bench/grpo.json

One GRPO step is: sample ``n`` completions for each of the step's prompts, score them with the
reward function, normalise rewards within each prompt's group, and make one optimizer step over
all completions in microbatches of ``--micro-bs`` completions. Both sides run that step on the
same saved random Qwen3, the same prompts in the same order, the same reward function, AdamW at
a constant learning rate with no weight decay, gradient clipping at 1.0, clip epsilon 0.2 and
the token-mean ("dapo") loss, no KL term, no reference model and no activation checkpointing.
Throughput is completions per wall second and per CPU second of the process over the timed
steps (the first ``--warmup`` steps of each run are not timed), and the reward columns show
that speed was not bought with learning: the mean reward of the first step's rollout (before
any update, so it should agree between the sides within run-to-run noise) and of the last
three steps' rollouts. Run ``r`` uses seed ``r`` on both sides, so repeating a command
repeats its rewards.

Work that differs (stated in the output): areno keeps the logprobs computed while sampling and
never recomputes them; TRL also skips that forward pass when, as here, each generation feeds
exactly one optimizer step. TRL samples with ``transformers.generate`` on the padded batch;
areno uses its native engine (continuous batching, EOS rows leave the batch). Both sides compute
the entropy of every completion token and clip fractions in each step (TRL 1.16 in
``GRPOTrainer._compute_loss``, kept in its in-memory metrics; areno in the loss statistics that
``LocalBackend.train`` returns); neither side writes them to files here.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SHAPES: dict[str, dict[str, Any]] = {
    # The tiny workload: arithmetic prompts, 16 prompts x 8 samples, <= 8 new tokens.
    "tiny": {
        "model": "random:qwen3-tiny",
        "prompts": 16,
        "samples": 8,
        "new_tokens": 8,
        "micro_bs": 128,
        "lr": 3e-3,
        "warmup": 1,
        "steps": 20,
    },
    # The larger shape: real GSM8K questions, the ~20M-parameter preset, 64 new tokens.
    "gsm8k": {
        "model": "random:qwen3-small",
        "prompts": 4,
        "samples": 8,
        "new_tokens": 64,
        "micro_bs": 32,
        "lr": 1e-4,
        "warmup": 1,
        "steps": 3,
    },
}
SIDES = ("areno", "trl")


# -- workload ---------------------------------------------------------------------------------


def arithmetic_rows(count: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(50), rng.randrange(50)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


def gsm8k_rows(count: int) -> list[dict[str, str]]:
    raw = common.read_jsonl(common.GSM8K_DIR / "train.jsonl", limit=count)
    return [
        {
            "prompt": f"Question: {r['question']}\nAnswer:",
            "answer": r["answer"].split("####")[-1].strip(),
        }
        for r in raw
    ]


def score_text(completion: str, answer: str) -> float:
    """1.0 if the completion opens with the answer (leading whitespace skipped) and the answer
    is not the start of a longer number; else the share of its characters that are digits.

    A random model never solves the task; the digit share still lets a group's rewards differ,
    so both trainers have something to learn. The full reward asks for the answer at the start
    on purpose: "the answer appears anywhere" paid 1.0 to about one random 64-token completion
    in seven when the answer is one digit (GSM8K has such answers), and those few lucky hits,
    worth some 30 times the digit share, decided the mean reward of a 32-sample step.
    """
    text = completion.lstrip()
    if answer and text.startswith(answer) and not text[len(answer) : len(answer) + 1].isdigit():
        return 1.0
    return digit_share(completion)


def digit_share(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


CHECKPOINTING = {"auto": None, "on": True, "off": False}

# -- children ---------------------------------------------------------------------------------


def areno_rollout(
    step: int,
    rows: list[dict[str, str]],
    shape: dict[str, Any],
    model: Any,
    engine: Any,
    sampling: Any,
    scorer: Any,
) -> tuple[list[Any], dict[str, Any]]:
    """areno's rollout of step ``step``: the step's ``shape["prompts"]`` rows, ``shape["samples"]``
    samples each, in one engine session. Returns the groups and the rollout metrics."""
    from areno_core.rollout.collect import collect_groups, prompt_item

    per_step = shape["prompts"]
    batch = rows[step * per_step : (step + 1) * per_step]
    items = [prompt_item(step * per_step + i, row) for i, row in enumerate(batch)]
    engine.start_session()
    groups, metrics = collect_groups(
        items,
        engine=engine,
        tokenizer=model.tokenizer,
        sampling=sampling,
        n_samples=shape["samples"],
        scorer=scorer,
        generator=model.rollout_generator,
    )
    engine.end_session()
    return groups, metrics


def areno_update(
    backend: Any,
    model: Any,
    groups: list[Any],
    shape: dict[str, Any],
    *,
    checkpointing: bool | None = False,
) -> None:
    """areno's GRPO update on one step's groups, with the settings of TRL's side
    (``checkpointing``: ``activation_checkpointing``; ``None`` is areno's default, auto)."""
    backend.train(
        model,
        groups,
        algorithm="grpo",
        learning_rate=shape["lr"],
        lr_decay_style="constant",
        weight_decay=0.0,
        grad_clip_norm=1.0,
        mini_bs=shape["micro_bs"],
        temperature=1.0,
        max_new_tokens=shape["new_tokens"],
        grpo_clip_eps=0.2,
        activation_checkpointing=checkpointing,
    )


def areno_parts(
    model_dir: Any,
    seed: int,
    *,
    share_prefix: bool = True,
    packed_forward: bool | None = None,
    shared_prompt_cache: bool | None = None,
) -> tuple[Any, Any, Any, Any]:
    """areno's side of a run: the model loaded from ``model_dir``, the local backend, the
    native engine on the model's policy, and the reward scorer (the completion decoded without
    special tokens, as TRL hands it to its reward function). ``None`` settings are areno's
    defaults."""
    from areno_core.backend import LocalBackend, TrainableModel
    from areno_core.contracts.engine import EngineOptions
    from areno_core.rewards import RewardScorer
    from areno_core.rollout.native import NativeEngine
    from areno_core.rollout.native_config import NativeEngineConfig

    model = TrainableModel.from_ckpt(str(model_dir), seed=seed)
    tokenizer = model.tokenizer
    backend = LocalBackend(device="cpu", share_prefix=share_prefix, packed_forward=packed_forward)
    engine = NativeEngine(
        model.policy,
        tokenizer,
        EngineOptions(attn_backend="native"),
        NativeEngineConfig(shared_prompt_cache=shared_prompt_cache),
    )

    def reward_fn(record: Any) -> float:
        text = tokenizer.decode(list(record.token_ids), skip_special_tokens=True)
        return score_text(text, record.answer or "")

    return model, backend, engine, RewardScorer(reward_fn)


def run_areno(args: Any, shape: dict[str, Any], rows: list[dict[str, str]]) -> dict[str, Any]:
    common.set_threads(args.threads)
    from areno_core.types import SamplingParams

    model, backend, engine, scorer = areno_parts(
        args.model_dir, args.seed, share_prefix=not args.no_share_prefix
    )
    sampling = SamplingParams(max_new_tokens=shape["new_tokens"], temperature=1.0)
    clock = common.StepClock(shape["warmup"])
    rewards: list[float] = []
    tokens = 0
    for step in range(shape["warmup"] + shape["steps"]):
        groups, metrics = areno_rollout(step, rows, shape, model, engine, sampling, scorer)
        # areno's default is auto, which this shape's few MiB of activations leave off (TRL's
        # side turns its default checkpointing off by hand); on/off only when asked.
        checkpointing = CHECKPOINTING[args.activation_checkpointing]
        areno_update(backend, model, groups, shape, checkpointing=checkpointing)
        # Tell the engine which policy version it samples from now, as the run loop does;
        # otherwise the next step's samples look stale and the trainer scores them again with
        # the current policy (the decoupled objective's proximal pass) before updating.
        engine.sync_weights(model.policy, version=model.optimizer_steps)
        rewards.append(metrics["rollout/reward_mean"])
        if step >= shape["warmup"]:
            tokens += sum(t.num_action_tokens for g in groups for t in g.trajectories)
        clock.mark()
    return _result(clock, shape, rewards, tokens)


def run_trl(args: Any, shape: dict[str, Any], rows: list[dict[str, str]]) -> dict[str, Any]:
    common.set_threads(args.threads)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    clock = common.StepClock(shape["warmup"])
    rewards: list[float] = []
    completion_tokens: list[int] = []

    def reward_fn(
        prompts: list[str],
        completions: list[str],
        completion_ids: list[list[int]],
        answer: list[str],
        **_: Any,
    ) -> list[float]:
        scores = [score_text(c, a) for c, a in zip(completions, answer, strict=True)]
        rewards.append(sum(scores) / len(scores))
        completion_tokens.append(sum(len(ids) for ids in completion_ids))
        return scores

    reward_fn.__name__ = "digits_reward"

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.mark()

    total = shape["warmup"] + shape["steps"]
    samples = shape["prompts"] * shape["samples"]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        per_device_train_batch_size=shape["micro_bs"],
        gradient_accumulation_steps=samples // shape["micro_bs"],
        num_generations=shape["samples"],
        max_completion_length=shape["new_tokens"],
        max_steps=total,
        learning_rate=shape["lr"],
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        bf16=False,
        shuffle_dataset=False,
        **common.trl_baseline_args(args.seed),
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=config,
        train_dataset=Dataset.from_list(rows[: total * shape["prompts"]]),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    tokens = sum(completion_tokens[shape["warmup"] :])
    return _result(clock, shape, rewards, tokens)


def _result(
    clock: common.StepClock, shape: dict[str, Any], rewards: list[float], tokens: int
) -> dict[str, Any]:
    samples = shape["prompts"] * shape["samples"] * clock.timed_steps
    seconds, cpu = clock.timed_seconds, clock.timed_cpu_seconds
    return {
        **common.rates("samples", samples, seconds, cpu),
        "step_s": seconds / clock.timed_steps,
        "step_cpu_s": cpu / clock.timed_steps,
        "completion_tokens_per_s": tokens / seconds,
        "reward_first": rewards[0],
        "reward_last3": sum(rewards[-3:]) / len(rewards[-3:]),
        "rewards": rewards,
        "steps": len(rewards),
    }


def resolve_shape(name: str, args: Any) -> dict[str, Any]:
    """The named shape with the command line's overrides; with fewer ``--prompts`` the
    microbatch shrinks to one step's samples, so both sides still take one optimizer step."""
    shape = dict(SHAPES[name])
    shape.update({k: v for k, v in _overrides(args).items() if v is not None})
    samples = shape["prompts"] * shape["samples"]
    shape["micro_bs"] = min(shape["micro_bs"], samples)
    if samples % shape["micro_bs"]:
        raise SystemExit(
            f"{shape['prompts']} prompts x {shape['samples']} samples is not a multiple of the "
            f"microbatch {shape['micro_bs']}"
        )
    return shape


def child_result(args: Any) -> dict[str, Any]:
    shape = resolve_shape(args.shape, args)
    rows = workload_rows(args.shape, shape)
    runner = run_areno if args.child == "areno" else run_trl
    return runner(args, shape, rows)


def workload_rows(name: str, shape: dict[str, Any]) -> list[dict[str, str]]:
    count = shape["prompts"] * (shape["warmup"] + shape["steps"])
    return arithmetic_rows(count) if name == "tiny" else gsm8k_rows(count)


def _overrides(args: Any) -> dict[str, Any]:
    return {"steps": args.steps, "prompts": args.prompts, "warmup": args.warmup}


# -- driver -----------------------------------------------------------------------------------


def drive(args: Any) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": common.machine_info(args.threads), "shapes": {}}
    print(f"machine: {report['machine']}")
    names = list(SHAPES) if args.shape == "all" else [args.shape]
    for name in names:
        shape = resolve_shape(name, args)
        print(
            f"\n== GRPO, shape {name}: {shape['model']}, {shape['prompts']} prompts x "
            f"{shape['samples']} samples, <= {shape['new_tokens']} new tokens, microbatch "
            f"{shape['micro_bs']}, lr {shape['lr']}, {shape['warmup']} warm-up + "
            f"{shape['steps']} timed steps per run, {args.reps} runs per side"
        )
        with tempfile.TemporaryDirectory(prefix="areno-bench-") as tmp:
            model_dir = common.save_random_model(shape["model"], Path(tmp) / "model")
            child_args = ["--shape", name, "--model-dir", str(model_dir), "--threads"]
            child_args.append(str(args.threads))
            if args.no_share_prefix:
                child_args.append("--no-share-prefix")
            child_args += ["--activation-checkpointing", args.activation_checkpointing]
            for key, value in _overrides(args).items():
                if value is not None:
                    child_args += [f"--{key}", str(value)]

            def run_one(side: str, rep: int, child_args: list[str] = child_args) -> dict:
                extra = ["--child", side, "--seed", str(rep)]
                return common.run_child(Path(__file__), [*child_args, *extra])

            results = common.interleaved(SIDES, args.reps, run_one)
        keys = ["samples_per_s", "samples_per_cpu_s", "step_s", "step_cpu_s", "reward_first"]
        summary = common.summarize(results, [*keys, "reward_last3", "peak_rss_mib"])
        report["shapes"][name] = {"shape": shape, "runs": results, "median": summary}
        print_summary(name, shape, summary)
        for line in common.ratio_lines(results, "trl", [("samples", "samples")]):
            print(line)
    print(
        "\nNot the same work on both sides: TRL samples with transformers.generate on the "
        "padded batch, areno with its native engine; neither recomputes old logprobs (one "
        "optimizer step per rollout); neither loads a reference model (beta = 0)."
    )
    return report


def print_summary(name: str, shape: dict[str, Any], summary: dict[str, dict[str, float]]) -> None:
    a, t = summary["areno"], summary["trl"]
    rows = []
    for side, s in (("areno", a), ("TRL GRPOTrainer", t)):
        rows.append(
            [
                side,
                s["samples_per_cpu_s"],
                s["samples_per_s"],
                s["step_cpu_s"],
                s["step_s"],
                _spread(s, "reward_first"),
                _spread(s, "reward_last3"),
                s["peak_rss_mib"],
                f"{s['load_min']:.1f}-{s['load_max']:.1f}",
            ]
        )
    steps = shape["warmup"] + shape["steps"]
    print(
        common.table(
            [
                "side",
                "samples per CPU-s",
                "samples per wall-s",
                "CPU-s/step",
                "wall-s/step",
                "reward step 1 (range)",
                f"reward steps {max(steps - 2, 1)}-{steps} (range)",
                "peak RSS MiB",
                "load",
            ],
            rows,
        )
    )
    print(
        f"medians areno/TRL: peak RSS {a['peak_rss_mib'] / t['peak_rss_mib']:.2f}x, "
        f"reward step 1 {a['reward_first'] - t['reward_first']:+.3f}, "
        f"final reward {a['reward_last3'] - t['reward_last3']:+.3f} (areno - TRL)"
    )


def _spread(summary: dict[str, float], key: str) -> str:
    return f"{summary[key]:.3f} ({summary[key + '_min']:.3f}-{summary[key + '_max']:.3f})"


def main() -> None:
    parser = common.base_parser(__doc__.split("\n\n")[0], profile=True)
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per run")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step")
    parser.add_argument(
        "--no-share-prefix",
        action="store_true",
        help="areno: run every row in full (LocalBackend(share_prefix=False)), to see the gain",
    )
    parser.add_argument(
        "--activation-checkpointing",
        choices=("auto", "on", "off"),
        default="auto",
        help="areno: its default (auto, which decides off for these shapes) or a fixed setting",
    )
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    common.run_role(parser, child=child_result, drive=drive)


if __name__ == "__main__":
    main()

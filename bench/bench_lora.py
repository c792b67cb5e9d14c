"""Memory of a training step with LoRA against full fine-tuning: a DPO step and a GRPO step.

    python bench/bench_lora.py                           # 3 runs per side, ~75M-parameter model
    python bench/bench_lora.py --algos dpo --reps 5 --lora-rank 16

Both sides train the same saved random Qwen3 on the same batch with ``LocalBackend.train``:
"full" updates every weight, "lora" attaches adapters (``--lora-rank``, every attention and MLP
projection) and updates only them. A DPO step scores a reference model: a frozen copy of the
policy for "full", the policy with its adapters switched off for "lora" (no copy). A GRPO step
(no reference) trains on fixed trajectory groups: GSM8K questions with random completion
tokens and random rewards, so no sampling is measured, only the update. Questions and answers
are cut to ``--chars`` characters (the byte-level tokenizer makes one token per byte).

Each run is its own process. It reports its resident memory once the model is loaded
(``rss_loaded_mib``), then restarts the kernel's peak-RSS mark and reports the peak over the
training steps (``train_peak_mib``, VmHWM) and what training added (``step_mib``: optimizer
state, gradients, the reference copy, activations), plus wall and process CPU seconds per
timed step (median). Activation checkpointing is on, as in ``areno train`` by default
(``--no-activation-checkpointing`` keeps every layer's activations, which then dominate).
Runs alternate sides (full, lora, lora, full, ...).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SIDES = ("full", "lora")
# ~75M parameters in float32 (~290 MiB of weights), so weights and optimizer state dominate
# the process's memory rather than Python and the libraries.
DEFAULT_MODEL = common.wide_qwen3(layers=12)


def dpo_rows(count: int, chars: int) -> list[dict[str, Any]]:
    raw = common.read_jsonl(common.GSM8K_DIR / "train.jsonl", limit=count)
    return [
        {
            "prompt": r["question"][:chars],
            "chosen": r["answer"][:chars],
            "rejected": ("I am not sure. " + r["answer"])[:chars],
        }
        for r in raw
    ]


def grpo_groups(
    tokenizer: Any, prompts: int, samples: int, length: int, chars: int, seed: int
) -> list[Any]:
    import torch

    from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

    raw = common.read_jsonl(common.GSM8K_DIR / "train.jsonl", limit=prompts)
    generator = torch.Generator().manual_seed(seed)
    vocab = len(tokenizer)
    groups = []
    for index, row in enumerate(raw):
        prompt_ids = tokenizer(row["question"][:chars]).input_ids
        trajectories = []
        for _ in range(samples):
            completion = torch.randint(3, vocab, (length,), generator=generator).tolist()
            logprobs = (-torch.rand(length, generator=generator) * 3).tolist()
            trajectories.append(
                Trajectory(
                    input_ids=[*prompt_ids, *completion],
                    loss_mask=[0] * len(prompt_ids) + [1] * length,
                    rollout_logprobs=[0.0] * len(prompt_ids) + logprobs,
                    reward=float(torch.rand((), generator=generator) > 0.5),
                    prompt_len=len(prompt_ids),
                )
            )
        item = PromptItem(index=index, row=row, prompt=row["question"])
        groups.append(TrajectoryGroup(item=item, trajectories=trajectories))
    return groups


def run_side(args: Any) -> dict[str, Any]:
    common.set_threads(args.threads)
    import torch

    from areno_core.backend import LocalBackend, TrainableModel
    from areno_core.models.lora import LoraSettings

    lora = LoraSettings(rank=args.lora_rank) if args.child == "lora" else None
    torch.manual_seed(args.seed)
    model = TrainableModel.from_ckpt(str(args.model_dir), seed=args.seed, lora=lora)
    backend = LocalBackend(device="cpu")
    if args.algo == "dpo":
        data: Any = dpo_rows(args.batch, args.chars)
    else:
        data = grpo_groups(
            model.tokenizer, args.batch, args.samples, args.length, args.chars, args.seed
        )
    gc.collect()
    loaded = common.status_mib("VmRSS")
    common.reset_peak_rss()  # from here on the peak is the training's (loading can peak higher)
    options = {
        "algorithm": args.algo,
        "learning_rate": 1e-5,
        "lr_decay_style": "constant",
        "mini_bs": args.micro_bs,
        "activation_checkpointing": not args.no_activation_checkpointing,
        "max_prompt_tokens": 4096,
        "max_new_tokens": 4096,
    }
    if args.algo == "grpo":
        options["gradient_accumulation_steps"] = 1
    walls, cpus = [], []
    for step in range(args.warmup + args.steps):
        wall, cpu = time.perf_counter(), time.process_time()
        backend.train(model, data, **options)
        if step >= args.warmup:
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    trainable = sum(p.numel() for p in model.policy.parameters() if p.requires_grad)
    peak = common.status_mib("VmHWM")
    return {
        "rss_loaded_mib": loaded,
        "train_peak_mib": peak,
        "step_mib": peak - loaded,
        "step_s": common.median(walls),
        "step_cpu_s": common.median(cpus),
        "trainable_params": float(trainable),
        "reference_copied": model.reference is not None,
    }


def drive(args: Any) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": common.machine_info(args.threads), "algos": {}}
    print(f"machine: {report['machine']}")
    with tempfile.TemporaryDirectory(prefix="areno-bench-lora-") as tmp:
        model_dir = common.save_random_model(args.model, Path(tmp) / "model")
        for algo in args.algos:
            shape = (
                f"{args.batch} pairs"
                if algo == "dpo"
                else f"{args.batch} prompts x {args.samples} samples of {args.length} tokens"
            )
            print(
                f"\n== {algo.upper()} step, {shape}, microbatches of {args.micro_bs} rows; "
                f"LoRA rank {args.lora_rank}; activation checkpointing "
                f"{'off' if args.no_activation_checkpointing else 'on'}; {args.warmup} warm-up + "
                f"{args.steps} timed steps per run, {args.reps} runs per side"
            )
            base = ["--model-dir", str(model_dir), "--threads", str(args.threads), "--algo", algo]
            keys = ("batch", "samples", "length", "chars", "micro_bs", "steps", "warmup")
            for key in (*keys, "lora_rank"):
                base += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
            if args.no_activation_checkpointing:
                base.append("--no-activation-checkpointing")

            def run_one(side: str, rep: int, base: list[str] = base) -> dict[str, Any]:
                return common.run_child(Path(__file__), [*base, "--child", side])

            results = common.interleaved(SIDES, args.reps, run_one)
            keys = ["train_peak_mib", "rss_loaded_mib", "step_mib", "step_s", "step_cpu_s"]
            summary = common.summarize(results, [*keys, "trainable_params"])
            ranges = {
                side: {k: (min(r[k] for r in runs), max(r[k] for r in runs)) for k in keys}
                for side, runs in results.items()
            }
            report["algos"][algo] = {"runs": results, "median": summary, "range": ranges}
            rows = []
            for side in SIDES:
                s, span = summary[side], ranges[side]
                rows.append(
                    [
                        side,
                        f"{s['trainable_params']:,.0f}",
                        f"{s['rss_loaded_mib']:,.0f}",
                        f"{s['train_peak_mib']:,.0f} ({span['train_peak_mib'][0]:,.0f}-"
                        f"{span['train_peak_mib'][1]:,.0f})",
                        f"{s['step_mib']:,.0f}",
                        f"{s['step_s']:.2f} ({span['step_s'][0]:.2f}-{span['step_s'][1]:.2f})",
                        f"{s['step_cpu_s']:.2f}",
                        f"{s['load_min']:.1f}-{s['load_max']:.1f}",
                    ]
                )
            print()
            print(
                common.table(
                    [
                        "side",
                        "trainable params",
                        "RSS loaded MiB",
                        "peak RSS in training MiB (range)",
                        "added by training MiB",
                        "wall s/step (range)",
                        "CPU s/step",
                        "load",
                    ],
                    rows,
                )
            )
            full, lora = summary["full"], summary["lora"]
            ratio = lora["train_peak_mib"] / full["train_peak_mib"]
            print(
                f"peak RSS in training: LoRA {lora['train_peak_mib']:,.0f} MiB, full "
                f"{full['train_peak_mib']:,.0f} MiB ({ratio:.2f}x); added by training: LoRA "
                f"{lora['step_mib']:,.0f} MiB, full {full['step_mib']:,.0f} MiB"
            )
    return report


def main() -> None:
    parser = common.base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="random: model to build")
    parser.add_argument("--algos", nargs="+", default=["dpo", "grpo"], choices=["dpo", "grpo"])
    parser.add_argument("--algo", default="dpo", help=argparse.SUPPRESS)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4, help="DPO pairs / GRPO prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="GRPO samples per prompt")
    parser.add_argument("--length", type=int, default=64, help="GRPO completion tokens")
    parser.add_argument(
        "--chars",
        type=int,
        default=96,
        help="characters kept of each question and answer (byte-level tokens: one per byte)",
    )
    parser.add_argument("--micro-bs", type=int, default=8, help="rows per microbatch")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    parser.add_argument(
        "--no-activation-checkpointing",
        action="store_true",
        help="keep every layer's activations (areno's default recomputes them in backward)",
    )
    parser.add_argument("--seed", type=int, default=0)
    common.run_role(parser, child=run_side, drive=drive)


if __name__ == "__main__":
    main()

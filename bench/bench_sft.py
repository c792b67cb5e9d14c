"""SFT throughput: areno's ``LocalBackend.train(algorithm="sft")`` against TRL's ``SFTTrainer``.

    python bench/bench_sft.py                           # GSM8K train rows, 3 runs per side
    python bench/bench_sft.py --model random:qwen3-mini --steps 8 --reps 5

Both sides train the same saved random Qwen3 on the same GSM8K train rows (question as a user
turn, worked answer as the assistant turn, rendered with the model's chat template), the same
rows in each optimizer step (``--batch`` rows, ``--micro-bs`` rows per microbatch), AdamW at a
constant learning rate with no weight decay, gradient clipping at 1.0, no activation
checkpointing, loss = mean NLL over the step's response tokens. TRL gets the very token ids
and response masks areno builds (a pre-tokenized dataset with ``input_ids`` and
``completion_mask``) and reads its rows in order. Throughput is target (response) tokens per
second over the timed steps, per wall second and per CPU second of the process, after
``--warmup`` untimed steps; each run is its own process so its peak RSS is its own. TRL's
data loader collates one microbatch ahead of the one it trains, so only the microbatches of
the timed steps are counted (the one collated last is never trained). All tokens (prompt and
response, no padding) per CPU second are reported beside target tokens: ``trl-packing``
trains other rows than areno in each step (best-fit decreasing puts the longest first), whose
share of response tokens differs.

Sides (``--sides``): ``areno`` (padded microbatches cut by length, ``packed_forward=False``;
the CPU default until 2026-11-27), ``areno-packed`` (``packed_forward``: rows without padding,
the CPU default since), ``areno-packed-bf16`` (the same on the model loaded
in bfloat16 with float32 master weights, what ``--dtype bfloat16`` runs), ``trl`` (padded),
``trl-padfree`` (``padding_free=True``), ``trl-packing`` (``packing=True``, best-fit
decreasing into 2,048-token sequences, one per microbatch; TRL then runs padding-free too) and
``trl-packing-bf16`` (the same with ``bf16=True``: the float32 model under bfloat16 autocast).
Ratios are printed against every TRL side that ran.

Work that differs (stated in the output): areno sorts the rows of an optimizer step by length
before cutting microbatches, and on a CPU runs a microbatch as several length-homogeneous
pieces when the padding saved outweighs one more pass (same rows per optimizer step, same
gradient); TRL pads each microbatch, in sampler order, to its longest row. TRL's trainer also
computes the entropy and top-1 accuracy of every token for its logs.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SIDES = (
    "areno",
    "areno-packed",
    "areno-packed-bf16",
    "trl",
    "trl-padfree",
    "trl-packing",
    "trl-packing-bf16",
)
# trl-packing: rows packed best-fit-decreasing into sequences of this many tokens, one sequence
# per microbatch (about --micro-bs GSM8K rows each, so a microbatch holds similar work).
PACK_TOKENS = 2048


def sft_rows(count: int) -> list[dict[str, Any]]:
    raw = common.read_jsonl(common.GSM8K_DIR / "train.jsonl", limit=count)
    return [
        {"prompt": [{"role": "user", "content": r["question"]}], "response": r["answer"]}
        for r in raw
    ]


def run_areno(args: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    common.set_threads(args.threads)
    from transformers import AutoTokenizer

    from areno_core.backend import LocalBackend, TrainableModel
    from areno_core.train import update as update_module
    from areno_core.train.featurize import sft_trajectories

    if args.no_split:  # measure the gain of cutting microbatches by length
        # Patching a name the updater no longer reads would measure nothing (it once did).
        if not callable(getattr(update_module, "_piece_cost", None)):
            raise RuntimeError("--no-split: areno_core.train.update._piece_cost is gone")
        update_module._piece_cost = lambda model, device: None

    # All tokens of each step's rows (prompt and response), counted as TRL's side counts them.
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    featurized, _ = sft_trajectories(rows, tokenizer, max_prompt_tokens=4096, max_new_tokens=4096)
    row_tokens = [len(t.input_ids) for t in featurized]

    dtype = "bfloat16" if args.child.endswith("-bf16") else "float32"
    model = TrainableModel.from_ckpt(str(args.model_dir), seed=args.seed, dtype=dtype)
    backend = LocalBackend(device="cpu", packed_forward="packed" in args.child)
    clock = common.StepClock(args.warmup)
    tokens = all_tokens = 0.0
    losses = []
    for step in range(args.warmup + args.steps):
        batch = rows[step * args.batch : (step + 1) * args.batch]
        result = backend.train(
            model,
            batch,
            algorithm="sft",
            learning_rate=args.lr,
            lr_decay_style="constant",
            weight_decay=0.0,
            grad_clip_norm=1.0,
            mini_bs=args.micro_bs,
            max_prompt_tokens=4096,
            max_new_tokens=4096,
            activation_checkpointing=False,  # as TRL's side (gradient_checkpointing=False)
        )
        losses.append(result.metrics["train/loss"])
        if step >= args.warmup:
            tokens += result.metrics["train/target_tokens"]
            all_tokens += sum(row_tokens[step * args.batch : (step + 1) * args.batch])
        clock.mark()
    return _result(clock, tokens, all_tokens, losses)


def run_trl(args: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    common.set_threads(args.threads)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from areno_core.train.featurize import sft_trajectories

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    trajectories, _ = sft_trajectories(rows, tokenizer, max_prompt_tokens=4096, max_new_tokens=4096)
    dataset = Dataset.from_list(
        [{"input_ids": t.input_ids, "completion_mask": t.loss_mask} for t in trajectories]
    )
    clock = common.StepClock(args.warmup)
    micro_tokens: list[tuple[int, int]] = []  # (target tokens, all tokens) per microbatch

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.mark()

    packing = args.child.startswith("trl-packing")
    config = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-sft-"),
        per_device_train_batch_size=1 if packing else args.micro_bs,
        gradient_accumulation_steps=args.batch // args.micro_bs,
        max_steps=args.warmup + args.steps,
        learning_rate=args.lr,
        max_length=PACK_TOKENS if packing else None,
        packing=packing,
        packing_strategy="bfd",
        padding_free=args.child == "trl-padfree",
        completion_only_loss=True,
        # trl-packing-bf16: the Trainer's bfloat16 mixed precision, which on a CPU runs the
        # float32 model under torch.autocast(cpu, bfloat16).
        bf16=args.child.endswith("-bf16"),
        train_sampling_strategy="sequential",
        **common.trl_baseline_args(args.seed),
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    collate = trainer.data_collator

    def counting_collator(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate(examples)
        mask = batch.get("attention_mask")
        real = int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
        micro_tokens.append((int((batch["labels"][:, 1:] != -100).sum()), real))
        return batch

    trainer.data_collator = counting_collator
    trainer.train()
    per_step = args.batch // args.micro_bs
    # The Trainer's data loader collates one microbatch ahead of the one it trains on, so the
    # last one collated is never trained: count the trained microbatches only.
    trained = micro_tokens[args.warmup * per_step : (args.warmup + args.steps) * per_step]
    if len(trained) != args.steps * per_step:
        raise RuntimeError(
            f"expected {args.steps * per_step} timed microbatches, got {len(trained)}"
        )
    tokens = float(sum(t for t, _ in trained))
    all_tokens = float(sum(n for _, n in trained))
    return _result(clock, tokens, all_tokens)  # TRL's losses are not collected (no logging)


def _result(
    clock: common.StepClock,
    tokens: float,
    all_tokens: float,
    losses: list[float] | None = None,
) -> dict[str, Any]:
    seconds = clock.timed_seconds
    result: dict[str, Any] = {
        **common.rates("target_tokens", tokens, seconds, clock.timed_cpu_seconds),
        **common.rates("tokens", all_tokens, seconds, clock.timed_cpu_seconds),
        "step_s": seconds / clock.timed_steps,
        "step_cpu_s": clock.timed_cpu_seconds / clock.timed_steps,
        "target_tokens": tokens,
        "tokens": all_tokens,
    }
    if losses is not None:
        result["losses"] = losses
    return result


def drive(args: Any) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": common.machine_info(args.threads)}
    print(f"machine: {report['machine']}")
    print(
        f"\n== SFT on GSM8K train rows, {args.model}, {args.batch} rows per optimizer step in "
        f"microbatches of {args.micro_bs}, lr {args.lr}, {args.warmup} warm-up + {args.steps} "
        f"timed steps per run, {args.reps} runs per side"
    )
    with tempfile.TemporaryDirectory(prefix="areno-bench-") as tmp:
        model_dir = common.save_random_model(args.model, Path(tmp) / "model")
        base = ["--model-dir", str(model_dir), "--threads", str(args.threads)]
        for key in ("batch", "micro_bs", "steps", "warmup", "lr"):
            base += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        if args.no_split:
            base.append("--no-split")

        def run_one(side: str, rep: int) -> dict[str, Any]:
            return common.run_child(Path(__file__), [*base, "--child", side])

        results = common.interleaved(args.sides, args.reps, run_one)
    keys = [
        "target_tokens_per_s",
        "target_tokens_per_cpu_s",
        "tokens_per_cpu_s",
        "step_s",
        "peak_rss_mib",
    ]
    summary = common.summarize(results, keys)
    report.update({"runs": results, "median": summary})
    rows = [
        [
            side,
            common.spread([r["target_tokens_per_cpu_s"] for r in results[side]]),
            common.spread([r["target_tokens_per_s"] for r in results[side]]),
            common.spread([r["tokens_per_cpu_s"] for r in results[side]]),
            s["peak_rss_mib"],
            f"{s['load_min']:.1f}-{s['load_max']:.1f}",
        ]
        for side, s in summary.items()
    ]
    print()
    headers = [
        "side",
        "target tok per CPU-s",
        "target tok per wall-s",
        "all tok per CPU-s",
        "peak RSS MiB",
        "load",
    ]
    print(common.table(headers, rows))
    print("(median (min-max) over runs; all tok: prompt and response tokens, padding excluded)")
    measures = [("target_tokens", "target tokens"), ("tokens", "all tokens")]
    for reference in [s for s in args.sides if s.startswith("trl")]:
        for line in common.ratio_lines(results, reference, measures):
            print(line)
    print(
        "\nNot the same work: areno sorts a step's rows by length and runs each microbatch "
        "as length-homogeneous pieces (less padding, same gradient), or packed (no padding); "
        "TRL pads each microbatch to its longest row (trl-padfree: padding_free=True, rows "
        "laid end to end; trl-packing: rows packed into 2,048-token sequences, so its "
        "microbatches hold other rows than areno's) and also computes per-token entropy and "
        "accuracy for its logs."
    )
    return report


def child_result(args: Any) -> dict[str, Any]:
    rows = sft_rows(args.batch * (args.warmup + args.steps))
    runner = run_areno if args.child.startswith("areno") else run_trl
    return runner(args, rows)


def main() -> None:
    parser = common.base_parser(__doc__.split("\n\n")[0], profile=True)
    parser.add_argument("--model", default="random:qwen3-small", help="random: model to build")
    parser.add_argument("--batch", type=int, default=16, help="rows per optimizer step")
    parser.add_argument("--micro-bs", type=int, default=8, help="rows per microbatch")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--no-split",
        action="store_true",
        help="areno: keep whole microbatches (no cutting by length), to see the gain",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, default=list(SIDES), help="what to compare"
    )
    common.run_role(parser, child=child_result, drive=drive)


if __name__ == "__main__":
    main()

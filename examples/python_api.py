"""The backend-first Python API, end to end on CPU in well under a minute.

    python examples/python_api.py                                  # the GSM8K rows in data/gsm8k
    python examples/python_api.py path/to/gsm8k/train.jsonl --out /tmp/api-run

Part 1 trains a tiny random Qwen3 with SFT on GSM8K (question -> worked answer), one
``backend.train`` call per batch, and logs each result explicitly with ``model.log``.
Part 2 is online RL: sample completions with the native rollout engine, score them with a reward
function, group them per prompt, and hand the groups to ``backend.train(..., algorithm="grpo")``.
Part 3 shows that a keyword the backend or the algorithm does not know is a ``TypeError``.

Each trainer step prints one line, ``<algorithm> step <n> loss <value>``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.contracts.engine import EngineOptions, RolloutSession
from areno_core.rewards import RewardScorer
from areno_core.rollout.collect import collect_groups, prompt_item
from areno_core.rollout.native import create_native_engine
from areno_core.types import RewardRecord, SamplingParams

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "gsm8k" / "train.jsonl"
# A model's optimizer settings are fixed by its first train() call: both phases pass these.
OPTIMIZER = {"learning_rate": 3e-3, "min_lr": 3e-4, "lr_decay_steps": 60}


def read_gsm8k(path: Path, limit: int) -> list[dict[str, str]]:
    """The first ``limit`` rows of a GSM8K JSONL file (``question`` and ``answer`` keys)."""
    rows = []
    with path.open() as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) == limit:
                break
    return rows


def sft_row(row: dict[str, str]) -> dict[str, object]:
    """SFT schema: ``prompt`` (text or chat messages) and ``response`` (the target text)."""
    return {"prompt": [{"role": "user", "content": row["question"]}], "response": row["answer"]}


def rl_row(row: dict[str, str]) -> dict[str, object]:
    """Online RL schema: ``prompt`` plus whatever the reward reads (here ``answer``)."""
    return {"prompt": row["question"], "answer": row["answer"].split("####")[-1].strip()}


def digits_reward_fn(record: RewardRecord) -> float:
    """1.0 if the reference answer appears in the completion, else the share of digit chars.

    A random model never solves GSM8K; the digit share gives the groups rewards that differ,
    so group-normalised advantages are not all zero.
    """
    if record.answer and record.answer in record.completion:
        return 1.0
    text = record.completion
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA, help="GSM8K JSONL")
    parser.add_argument("--out", type=Path, default=None, help="metrics directory (default: tmp)")
    parser.add_argument("--sft-steps", type=int, default=6)
    parser.add_argument("--grpo-steps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(2)
    out = args.out or Path(tempfile.mkdtemp(prefix="areno-api-"))

    # -- Part 1: supervised fine-tuning ------------------------------------------------------
    batch_size = 8
    raw = read_gsm8k(args.data, batch_size * args.sft_steps + 16)
    model = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0, metrics_dir=str(out))
    backend = LocalBackend(device="cpu")
    for i in range(args.sft_steps):
        rows = [sft_row(r) for r in raw[i * batch_size : (i + 1) * batch_size]]
        result = backend.train(
            model, rows, algorithm="sft", **OPTIMIZER, mini_bs=8, max_new_tokens=128
        )
        model.log(metrics=result.metrics, step=result.step)
        print(f"sft step {result.step} loss {result.metrics['train/loss']:.4f}", flush=True)

    # -- Part 2: online RL with GRPO ---------------------------------------------------------
    # The RL phase passes the same OPTIMIZER settings; the clip and accumulation options may
    # change.
    engine = create_native_engine(
        model.policy, model.tokenizer, EngineOptions(attn_backend="native")
    )
    scorer = RewardScorer(digits_reward_fn)
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0)
    prompts = [rl_row(r) for r in raw[-16:]]
    for i in range(args.grpo_steps):
        items = [prompt_item(i * 4 + j, row) for j, row in enumerate(prompts[i * 4 : i * 4 + 4])]
        # The engine samples from the current policy (free for the native engine, which shares
        # the module; an engine with its own copy of the weights needs it).
        engine.sync_weights(model.policy, version=model.optimizer_steps)
        with RolloutSession(engine):
            groups, rollout_metrics = collect_groups(
                items,
                engine=engine,
                tokenizer=model.tokenizer,
                sampling=sampling,
                n_samples=4,
                scorer=scorer,
                generator=model.rollout_generator,
            )
        # 16 trajectories in microbatches of 8, one optimizer step per microbatch: the second
        # step's ratios are taken against the rollout logprobs after the first step moved the
        # policy, so they leave 1 and the clip can bind.
        result = backend.train(
            model,
            groups,
            algorithm="grpo",
            **OPTIMIZER,
            mini_bs=8,
            gradient_accumulation_steps=1,
            grpo_clip_eps=0.2,
        )
        metrics = {**rollout_metrics, **result.metrics}
        model.log(groups, metrics=metrics, step=result.step)
        print(
            f"grpo step {result.step} loss {metrics['train/loss']:.4f} "
            f"reward {metrics['rollout/reward_mean']:.3f} "
            f"ratio [{metrics['train/ratio_min']:.3f}, {metrics['train/ratio_max']:.3f}] "
            f"clip_fraction {metrics['train/clip_fraction']:.3f} "
            f"optimizer_steps {metrics['train/optimizer_steps']:.0f}",
            flush=True,
        )

    # -- Part 3: typed keywords --------------------------------------------------------------
    try:
        backend.train(model, groups, algorithm="grpo", dpo_beta=0.1)
    except TypeError as exc:
        print(f"TypeError: {exc}")
    model.close()
    print(f"metrics: {out / 'metrics.jsonl'}")


if __name__ == "__main__":
    main()

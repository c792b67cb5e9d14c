"""The machine's ceiling: measured matmul FLOP/s, and how much of it an areno GRPO step uses.

    python bench/bench_ceiling.py                       # the GRPO "gsm8k" shape of bench_grpo.py
    python bench/bench_ceiling.py --steps 5 --prompts 8

Part 1 times float32 ``torch.mm`` at a few sizes (square, and the shapes of the ~20M-parameter
model's projections at training batch sizes) with the same thread count as the benchmarks and
takes the best median as the machine's peak. Part 2 runs the larger GRPO shape of
``bench_grpo.py`` with areno: the warm-up step runs under ``torch.utils.flop_counter`` to count
the floating-point operations of the rollout (prefill + decode) and of the update (forward +
backward of every microbatch), then the timed steps run without the counter. Achieved FLOP/s =
counted FLOPs / seconds, reported for the whole step, the rollout and the update separately,
as a fraction of the measured peak.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_grpo
import common

MATMUL_SHAPES = (
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (2048, 512, 1152),  # [tokens, hidden] @ [hidden, intermediate]
    (2048, 1152, 512),
    (512, 512, 512),
)


def matmul_peak(repeats: int) -> dict[str, Any]:
    import torch

    results = {}
    for m, k, n in MATMUL_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            torch.mm(a, b)
        rates = []
        for _ in range(repeats):
            inner = max(1, int(2e9 // (2 * m * k * n)))
            began = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b)
            rates.append(inner * 2 * m * k * n / (time.perf_counter() - began))
        results[f"{m}x{k}x{n}"] = common.median(rates)
    return {"per_shape_flops": results, "peak_flops": max(results.values())}


def grpo_utilisation(args: Any, model_dir: Path) -> dict[str, Any]:
    from torch.utils.flop_counter import FlopCounterMode

    from areno_core.backend import LocalBackend, TrainableModel
    from areno_core.rewards import RewardScorer
    from areno_core.rollout.base import EngineOptions
    from areno_core.rollout.collect import collect_groups, prompt_item
    from areno_core.rollout.native import NativeEngine
    from areno_core.types import SamplingParams

    shape = dict(bench_grpo.SHAPES["gsm8k"])
    shape.update({k: v for k, v in {"steps": args.steps, "prompts": args.prompts}.items() if v})
    rows = bench_grpo.gsm8k_rows(shape["prompts"] * (1 + shape["steps"]))
    model = TrainableModel.from_ckpt(str(model_dir), seed=0)
    tokenizer = model.tokenizer
    backend = LocalBackend(device="cpu")
    engine = NativeEngine(model.policy, tokenizer, EngineOptions(attn_backend="native"))

    def reward_fn(record: Any) -> float:
        text = tokenizer.decode(list(record.token_ids), skip_special_tokens=True)
        return bench_grpo.score_text(text, record.answer or "")

    scorer = RewardScorer(reward_fn)
    sampling = SamplingParams(max_new_tokens=shape["new_tokens"], temperature=1.0)
    per_step = shape["prompts"]

    def rollout(step: int) -> Any:
        batch = rows[step * per_step : (step + 1) * per_step]
        items = [prompt_item(step * per_step + i, row) for i, row in enumerate(batch)]
        engine.start_session()
        groups, _ = collect_groups(
            items,
            engine=engine,
            tokenizer=tokenizer,
            sampling=sampling,
            n_samples=shape["samples"],
            scorer=scorer,
            generator=model.rollout_generator,
        )
        engine.end_session()
        return groups

    def update(groups: Any) -> None:
        backend.train(
            model,
            groups,
            algorithm="grpo",
            learning_rate=shape["lr"],
            lr_decay_style="constant",
            weight_decay=0.0,
            mini_bs=shape["micro_bs"],
            max_new_tokens=shape["new_tokens"],
            # The counted warm-up and the timed steps must do the same work: no recomputed
            # activations, and the engine told the policy version, as the run loop does (else
            # the timed steps' samples look stale and get an extra proximal forward pass).
            activation_checkpointing=False,
        )
        engine.sync_weights(model.policy, version=model.optimizer_steps)

    counter = FlopCounterMode(display=False)
    with counter:
        groups = rollout(0)
    rollout_flops = counter.get_total_flops()
    counter = FlopCounterMode(display=False)
    with counter:
        update(groups)
    update_flops = counter.get_total_flops()

    rollout_s, update_s = [], []
    for step in range(1, 1 + shape["steps"]):
        began = time.perf_counter()
        groups = rollout(step)
        middle = time.perf_counter()
        update(groups)
        rollout_s.append(middle - began)
        update_s.append(time.perf_counter() - middle)
    return {
        "shape": shape,
        "rollout_flops": rollout_flops,
        "update_flops": update_flops,
        "rollout_s": common.median(rollout_s),
        "update_s": common.median(update_s),
    }


def main() -> None:
    parser = common.base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed GRPO steps")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step")
    parser.add_argument("--repeats", type=int, default=5, help="timings per matmul shape")
    args = parser.parse_args()
    common.set_threads(args.threads)
    machine = common.machine_info(args.threads)
    print(f"machine: {machine}")
    load_before = common.load_average()
    peak = matmul_peak(args.repeats)
    print("\n== float32 matmul throughput (median of repeats)")
    print(
        common.table(
            ["m x k x n", "GFLOP/s"],
            [[shape, rate / 1e9] for shape, rate in peak["per_shape_flops"].items()],
        )
    )
    peak_flops = peak["peak_flops"]
    print(f"peak: {peak_flops / 1e9:.1f} GFLOP/s")

    with tempfile.TemporaryDirectory(prefix="areno-bench-") as tmp:
        model_dir = common.save_random_model(
            bench_grpo.SHAPES["gsm8k"]["model"], Path(tmp) / "model"
        )
        used = grpo_utilisation(args, model_dir)
    shape = used["shape"]
    rows = []
    for label, flops, seconds in (
        ("rollout (prefill + decode)", used["rollout_flops"], used["rollout_s"]),
        ("update (forward + backward)", used["update_flops"], used["update_s"]),
        (
            "whole GRPO step",
            used["rollout_flops"] + used["update_flops"],
            used["rollout_s"] + used["update_s"],
        ),
    ):
        achieved = flops / seconds
        rows.append([label, flops / 1e9, seconds, achieved / 1e9, f"{achieved / peak_flops:.1%}"])
    print(
        f"\n== areno GRPO step, {shape['model']}, {shape['prompts']} GSM8K prompts x "
        f"{shape['samples']} samples, {shape['new_tokens']} new tokens (median of "
        f"{shape['steps']} steps)"
    )
    print(common.table(["phase", "GFLOP", "seconds", "GFLOP/s", "of peak"], rows))
    print(f"load: {load_before:.1f} before, {common.load_average():.1f} after")
    common.write_json(
        args.json,
        {
            "machine": machine,
            "matmul": peak,
            "grpo": used,
            "load": [load_before, common.load_average()],
        },
    )


if __name__ == "__main__":
    main()

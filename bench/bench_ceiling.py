"""The machine's ceiling: measured matmul FLOP/s, and how much of it an areno GRPO step uses.

    python bench/bench_ceiling.py                       # the GRPO "gsm8k" shape of bench_grpo.py
    python bench/bench_ceiling.py --steps 5 --prompts 8
    python bench/bench_ceiling.py --shape tiny --steps 2 --prompts 1   # a quick check of the script

Part 1 times float32 ``torch.mm`` at a few sizes (square, and the shapes of the ~20M-parameter
model's projections at training batch sizes) with the same thread count as the benchmarks and
takes the best median as the machine's peak. Part 2 runs the larger GRPO shape of
``bench_grpo.py`` with areno: the warm-up step runs under ``torch.utils.flop_counter`` to count
the floating-point operations of the rollout (prefill + decode) and of the update (forward +
backward of every microbatch), then the timed steps run without the counter. Achieved FLOP/s =
counted FLOPs / seconds, reported for the whole step, the rollout and the update separately,
as a fraction of the measured peak.

A shared virtual machine's speed drifts (on one 2-vCPU guest the peak measured 76 to 101
GFLOP/s in three runs of this script a few minutes apart), so a peak taken once at the start
can flatter or wrong the steps timed a minute later. The matmul peak is therefore measured
again (``--probe-repeats`` timings per size) before every timed step and after the last one,
and each step's share is taken against the mean of the two peaks around it. Every rate is
given per wall second and per CPU second of this process (one thread: CPU time excludes the
time another process held the core).
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
    """Best median float32 matmul rate over :data:`MATMUL_SHAPES`, per wall and CPU second."""
    import torch

    wall_rates: dict[str, float] = {}
    cpu_rates: dict[str, float] = {}
    for m, k, n in MATMUL_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            torch.mm(a, b)
        walls, cpus = [], []
        for _ in range(repeats):
            inner = max(1, int(2e9 // (2 * m * k * n)))
            began, began_cpu = time.perf_counter(), time.process_time()
            for _ in range(inner):
                torch.mm(a, b)
            work = inner * 2 * m * k * n
            walls.append(work / (time.perf_counter() - began))
            cpus.append(work / max(time.process_time() - began_cpu, 1e-9))
        wall_rates[f"{m}x{k}x{n}"] = common.median(walls)
        cpu_rates[f"{m}x{k}x{n}"] = common.median(cpus)
    return {
        "per_shape_flops": wall_rates,
        "per_shape_flops_cpu": cpu_rates,
        "peak_flops": max(wall_rates.values()),
        "peak_flops_cpu": max(cpu_rates.values()),
    }


def grpo_utilisation(args: Any, model_dir: Path) -> dict[str, Any]:
    """Counted FLOPs of one GRPO step's rollout and update, then per timed step: its wall and
    CPU seconds and the matmul peak measured right before it (plus one after the last)."""
    from torch.utils.flop_counter import FlopCounterMode

    from areno_core.backend import LocalBackend, TrainableModel
    from areno_core.contracts.engine import EngineOptions
    from areno_core.rewards import RewardScorer
    from areno_core.rollout.native import NativeEngine
    from areno_core.types import SamplingParams

    shape = dict(bench_grpo.SHAPES[args.shape])
    shape.update({k: v for k, v in {"steps": args.steps, "prompts": args.prompts}.items() if v})
    shape["micro_bs"] = min(shape["micro_bs"], shape["prompts"] * shape["samples"])
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

    def rollout(step: int) -> Any:
        groups, _ = bench_grpo.areno_rollout(step, rows, shape, model, engine, sampling, scorer)
        return groups

    def update(groups: Any) -> None:
        # The counted warm-up and the timed steps must do the same work: bench_grpo's update
        # (no recomputed activations), and the engine told the policy version, as the run loop
        # does (else the timed steps' samples look stale and get an extra proximal forward pass).
        bench_grpo.areno_update(backend, model, groups, shape)
        engine.sync_weights(model.policy, version=model.optimizer_steps)

    counter = FlopCounterMode(display=False)
    with counter:
        groups = rollout(0)
    rollout_flops = counter.get_total_flops()
    counter = FlopCounterMode(display=False)
    with counter:
        update(groups)
    update_flops = counter.get_total_flops()
    warmup_groups = groups

    steps: list[dict[str, float]] = []
    timed_groups = []
    probes = [matmul_peak(args.probe_repeats)]
    for step in range(1, 1 + shape["steps"]):
        began, began_cpu = time.perf_counter(), time.process_time()
        groups = rollout(step)
        middle, middle_cpu = time.perf_counter(), time.process_time()
        update(groups)
        timed_groups.append(groups)
        steps.append(
            {
                "rollout_s": middle - began,
                "rollout_cpu_s": middle_cpu - began_cpu,
                "update_s": time.perf_counter() - middle,
                "update_cpu_s": time.process_time() - middle_cpu,
            }
        )
        probes.append(matmul_peak(args.probe_repeats))

    # Each step's rollout samples other lengths, so its update does other work than the
    # warm-up's: count every timed step's update FLOPs by running it again, untimed, on the
    # same groups (the count depends on the shapes only, not on the weights).
    def recount(groups: Any) -> int:
        # As sampled by the current policy, as in the timed pass: a sample older than the
        # policy would make the trainer add a proximal forward pass the timing never saw.
        for group in groups:
            for trajectory in group.trajectories:
                trajectory.policy_version = model.optimizer_steps
        counter = FlopCounterMode(display=False)
        with counter:
            update(groups)
        return counter.get_total_flops()

    for record, groups in zip(steps, timed_groups, strict=True):
        record["update_flops"] = recount(groups)
        # The rollout is not replayed (sampling would draw other lengths): its FLOPs are the
        # warm-up step's count, an estimate for the timed steps.
        record["rollout_flops"] = rollout_flops
    # The same replay of the warm-up's groups must give the warm-up's own count.
    warmup_recounted = recount(warmup_groups)
    if warmup_recounted != update_flops:
        raise RuntimeError(
            f"replaying the warm-up update counted {warmup_recounted} FLOPs, not the "
            f"{update_flops} of the warm-up itself: the replay does other work than a step"
        )
    for i, record in enumerate(steps):
        for clock in ("", "_cpu"):
            around = [probes[i][f"peak_flops{clock}"], probes[i + 1][f"peak_flops{clock}"]]
            record[f"peak_flops{clock}"] = sum(around) / 2
    return {
        "shape": shape,
        "rollout_flops": rollout_flops,
        "update_flops": update_flops,
        "steps": steps,
        "probes": probes,
        "rollout_s": common.median([r["rollout_s"] for r in steps]),
        "update_s": common.median([r["update_s"] for r in steps]),
    }


def _shares(used: dict[str, Any], phases: tuple[str, ...], clock: str) -> list[tuple[float, float]]:
    """Per timed step: achieved FLOP/s of ``phases`` and its share of the adjacent peaks."""
    out = []
    for record in used["steps"]:
        seconds = sum(record[f"{phase}{clock}_s"] for phase in phases)
        achieved = sum(record[f"{phase}_flops"] for phase in phases) / seconds
        out.append((achieved, achieved / record[f"peak_flops{clock}"]))
    return out


def main() -> None:
    parser = common.base_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shape",
        choices=tuple(bench_grpo.SHAPES),
        default="gsm8k",
        help="bench_grpo.py's GRPO shape (the model, samples and new tokens; the prompts stay "
        "GSM8K questions); tiny is for testing the script, not for a measurement",
    )
    parser.add_argument("--steps", type=int, default=3, help="timed GRPO steps")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step")
    parser.add_argument("--repeats", type=int, default=5, help="timings per matmul shape")
    parser.add_argument(
        "--probe-repeats",
        type=int,
        default=2,
        help="timings per matmul shape of the peak measured again around every timed step",
    )
    args = parser.parse_args()
    for flag in ("steps", "repeats", "probe_repeats"):
        value = getattr(args, flag)
        if value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    common.set_threads(args.threads)
    machine = common.machine_info(args.threads)
    print(f"machine: {machine}")
    load_before = common.load_average()
    peak = matmul_peak(args.repeats)
    print("\n== float32 matmul throughput (median of repeats)")
    print(
        common.table(
            ["m x k x n", "GFLOP/s", "GFLOP per CPU-s"],
            [
                [shape, rate / 1e9, peak["per_shape_flops_cpu"][shape] / 1e9]
                for shape, rate in peak["per_shape_flops"].items()
            ],
        )
    )
    print(
        f"peak: {peak['peak_flops'] / 1e9:.1f} GFLOP/s, "
        f"{peak['peak_flops_cpu'] / 1e9:.1f} GFLOP per CPU-s"
    )

    with tempfile.TemporaryDirectory(prefix="areno-bench-") as tmp:
        model_dir = common.save_random_model(
            bench_grpo.SHAPES[args.shape]["model"], Path(tmp) / "model"
        )
        used = grpo_utilisation(args, model_dir)
    shape = used["shape"]
    print(
        f"\n== areno GRPO step, {shape['model']}, {shape['prompts']} GSM8K prompts x "
        f"{shape['samples']} samples, {shape['new_tokens']} new tokens, {shape['steps']} "
        "timed steps; each step against the mean of the peaks measured right before and "
        "after it"
    )
    rows = []
    phases = (
        ("rollout (prefill + decode)*", ("rollout",)),
        ("update (forward + backward)", ("update",)),
        ("whole GRPO step*", ("rollout", "update")),
    )
    summary: dict[str, dict[str, list[float]]] = {}
    for label, names in phases:
        wall = _shares(used, names, "")
        cpu = _shares(used, names, "_cpu")
        summary[label] = {"share": [s for _, s in wall], "share_cpu": [s for _, s in cpu]}
        flops = [sum(r[f"{phase}_flops"] for phase in names) for r in used["steps"]]
        rows.append(
            [
                label,
                common.spread([f / 1e9 for f in flops]),
                common.spread([a / 1e9 for a, _ in wall]),
                common.spread([100 * s for _, s in wall], "%"),
                common.spread([a / 1e9 for a, _ in cpu]),
                common.spread([100 * s for _, s in cpu], "%"),
            ]
        )
    headers = ["phase", "GFLOP", "GFLOP/s", "of peak", "GFLOP per CPU-s", "of peak (CPU)"]
    print(common.table(headers, rows))
    print(
        "(median (min-max) over the timed steps; GFLOP counted for each timed step's update; "
        "* the rollout's GFLOP are the warm-up step's count, an estimate for the timed steps)"
    )
    print(
        "peaks around the steps: "
        + ", ".join(f"{p['peak_flops'] / 1e9:.1f}" for p in used["probes"])
        + " GFLOP/s; per CPU-s: "
        + ", ".join(f"{p['peak_flops_cpu'] / 1e9:.1f}" for p in used["probes"])
    )
    print(f"load: {load_before:.1f} before, {common.load_average():.1f} after")
    common.write_json(
        args.json,
        {
            "machine": machine,
            "matmul": peak,
            "grpo": used,
            "shares": summary,
            "load": [load_before, common.load_average()],
        },
    )


if __name__ == "__main__":
    main()

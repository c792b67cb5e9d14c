"""Distributed backend on this CPU: per-rank memory and step time at 1 and 2 processes.

    python bench/bench_distributed.py                    # ~50M-parameter Qwen3, 3 runs per side
    python bench/bench_distributed.py --reps 5 --steps 4

Both sides run ``DistributedBackend`` (FSDP2 over the data-parallel ranks, gloo) on the same
saved random Qwen3 and the same GSM8K SFT rows: ``--batch`` rows per optimizer step (one
optimizer step per trainer step), microbatches of ``--micro-bs`` rows. ``world1`` is one
process with ``--threads x 2`` torch threads; ``world2`` is two processes (torchrun) with
``--threads`` threads each, so both sides use the same number of cores. Runs alternate sides.

Per rank, each run reports:

* ``state MiB``: the bytes this rank holds for parameters and AdamW moments after a step
  (its FSDP2 shards; exact, from the tensors), which should fall to about 1/N at N ranks;
* ``RSS between steps MiB``: the process's resident memory after the warm-up step, once freed
  heap memory has been handed back (``malloc_trim``): the Python runtime, torch and the shards;
* ``peak RSS in a step MiB``: the peak resident memory during the timed steps (the high-water
  mark is reset at that point through ``/proc/self/clear_refs``, so loading the full model
  before sharding does not count): the above plus gradients, activations and gathered layers;
* ``s/step`` and ``CPU s/step``: wall-clock time per trainer step and this process's CPU time
  per step (user + system) over the timed steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SIDES = ("world1", "world2")
# About 50M parameters: 8 decoder layers of width 768 on the 272-token byte vocabulary.
MODEL = common.wide_qwen3(layers=8)


def release_and_reset_peak_rss() -> float:
    """Give freed heap memory back to the system, then restart the peak-RSS count from the
    current RSS (returned, MiB): what the process holds between steps."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc keeps freed blocks otherwise
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    common.reset_peak_rss()
    return common.status_mib("VmRSS")


def local_bytes(tensors: Any) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def run_rank(args: Any) -> dict[str, Any]:
    """One rank of a measured run (started by torchrun for world2, directly for world1)."""
    import torch

    torch.set_num_threads(args.threads)
    from areno_core.model import TrainableModel
    from areno_core.train.distributed.backend import DistributedBackend
    from areno_core.train.distributed.context import init_distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    ctx = init_distributed(world_size=world, tp_size=1, timeout_s=1800)
    backend = DistributedBackend(ctx)
    model = TrainableModel.from_ckpt(str(args.model_dir), seed=0)
    # Questions cut to half the token cap, so no row is skipped for a long prompt (the byte
    # tokenizer makes one token per character); answers are cut at the cap by the trainer.
    rows = [
        {"prompt": r["question"][: args.max_tokens // 2], "response": r["answer"]}
        for r in common.read_jsonl(common.GSM8K_DIR / "train.jsonl", limit=args.batch * 8)
    ]
    options = {
        "algorithm": "sft",
        "learning_rate": 1e-4,
        "mini_bs": args.micro_bs,
        "max_prompt_tokens": args.max_tokens,
        "max_new_tokens": args.max_tokens,
        "activation_checkpointing": False,
    }
    wall, cpu, losses = [], [], []
    held = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            held = release_and_reset_peak_rss()
        batch = rows[step * args.batch : (step + 1) * args.batch]
        ctx.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        result = backend.train(model, batch, **options)
        t1, c1 = time.perf_counter(), time.process_time()
        if result.metrics["train/skipped_rows"]:
            raise RuntimeError(f"{result.metrics['train/skipped_rows']:.0f} rows were skipped")
        losses.append(result.metrics["train/loss"])
        if step >= args.warmup:
            wall.append(t1 - t0)
            cpu.append(c1 - c0)
    params = list(model.policy.parameters())
    moments = [v for s in model.optimizer.state.values() for v in s.values() if v.dim() > 0]
    return {
        "rank": ctx.rank,
        "world": world,
        "step_s": common.median(wall),
        "cpu_s_per_step": common.median(cpu),
        "param_mib": local_bytes(params) / 2**20,
        "optimizer_mib": local_bytes(moments) / 2**20,
        "held_rss_mib": held,
        "peak_step_rss_mib": common.status_mib("VmHWM"),
        "losses": losses,
        "parameters": sum(p.numel() for p in params),
    }


def measure(side: str, args: Any, model_dir: Path) -> list[dict[str, Any]]:
    """One measured run of ``side``: every rank's result line."""
    world = 2 if side == "world2" else 1
    threads = args.threads if world == 2 else args.threads * 2
    child = [
        str(Path(__file__)), "--child", side, "--model-dir", str(model_dir),
        "--threads", str(threads), "--batch", str(args.batch), "--micro-bs", str(args.micro_bs),
        "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--max-tokens", str(args.max_tokens),
    ]  # fmt: skip
    if world == 2:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", *child]  # fmt: skip
    else:
        command = [sys.executable, *child]
    load_before = common.load_average()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        # As the areno command sets it: waiting threads sleep instead of spinning on shared cores.
        "OMP_WAIT_POLICY": "PASSIVE",
        "PYTHONPATH": common._pythonpath(),
    }
    proc = subprocess.run(command, capture_output=True, text=True, cwd=str(common.REPO), env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(common.RESULT_PREFIX)]
    if proc.returncode != 0 or len(lines) != world:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"{side} run failed (rc={proc.returncode}):\n{tail}")
    results = sorted((json.loads(ln[len(common.RESULT_PREFIX) :]) for ln in lines), key=_rank)
    for r in results:
        r.update(load_before=load_before, load_after=common.load_average())
    return results


def _rank(result: dict[str, Any]) -> int:
    return int(result["rank"])


def drive(args: Any) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": common.machine_info(args.threads), "model": args.model}
    print(f"machine: {report['machine']}")
    print(
        f"\n== SFT with the distributed backend (FSDP2, gloo), {args.batch} rows per step in "
        f"microbatches of {args.micro_bs}, {args.warmup} warm-up + {args.steps} timed steps, "
        f"{args.reps} runs per side; world1: 1 process x {args.threads * 2} threads, world2: "
        f"2 processes x {args.threads} thread(s)"
    )
    with tempfile.TemporaryDirectory(prefix="areno-bench-") as tmp:
        model_dir = common.save_random_model(args.model, Path(tmp) / "model")
        runs: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in SIDES}
        for rep in range(args.reps):
            for side in SIDES if rep % 2 == 0 else reversed(SIDES):
                ranks = measure(side, args, model_dir)
                runs[side].append(ranks)
                print(f"  rep {rep + 1}/{args.reps} {side}: " + "; ".join(_short(r) for r in ranks))
    report["runs"] = runs
    rows = []
    for side in SIDES:
        per_rank = [r for run in runs[side] for r in run]
        # The step ends when the slowest rank ends: a run's time is its slowest rank's.
        steps = [max(r["step_s"] for r in run) for run in runs[side]]
        cpu = [sum(r["cpu_s_per_step"] for r in run) for run in runs[side]]
        loads = [x for r in per_rank for x in (r["load_before"], r["load_after"])]
        rows.append(
            [
                side,
                f"{common.median([r['param_mib'] for r in per_rank]):.1f}",
                f"{common.median([r['optimizer_mib'] for r in per_rank]):.1f}",
                f"{common.median([r['held_rss_mib'] for r in per_rank]):,.0f}",
                f"{common.median([r['peak_step_rss_mib'] for r in per_rank]):,.0f}",
                f"{common.median(steps):.2f} ({min(steps):.2f}-{max(steps):.2f})",
                f"{common.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f})",
                f"{min(loads):.1f}-{max(loads):.1f}",
            ]
        )
    print()
    print(
        common.table(
            [
                "side",
                "params MiB/rank",
                "AdamW MiB/rank",
                "RSS between steps MiB/rank",
                "peak RSS in a step MiB/rank",
                "s/step median (range)",
                "CPU s/step, all ranks",
                "load",
            ],
            rows,
        )
    )
    first = runs["world1"][0][0]["losses"]
    second = runs["world2"][0][0]["losses"]
    print(f"\nlosses, world1: {first}\nlosses, world2: {second}")
    return report


def _short(result: dict[str, Any]) -> str:
    return (
        f"rank {result['rank']} {result['step_s']:.2f} s/step cpu {result['cpu_s_per_step']:.2f} "
        f"state {result['param_mib'] + result['optimizer_mib']:.0f} MiB "
        f"peak {result['peak_step_rss_mib']:.0f} MiB load {result['load_before']:.1f}"
    )


def main() -> None:
    parser = common.base_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL, help="random: model to build (~50M default)")
    parser.add_argument("--batch", type=int, default=8, help="rows per optimizer step")
    parser.add_argument("--micro-bs", type=int, default=4, help="rows per microbatch")
    parser.add_argument("--steps", type=int, default=2, help="timed trainer steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    parser.add_argument("--max-tokens", type=int, default=96, help="prompt / response cap")
    common.run_role(parser, child=run_rank, drive=drive)


if __name__ == "__main__":
    main()

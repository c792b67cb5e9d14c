"""Asynchronous against synchronous rollout on the math/arith recipe, at equal wall time.

    python bench/bench_async.py                          # 3 runs per side, 150 s each
    python bench/bench_async.py --budget 300 --reps 5 --json runs/bench/async.json
    python bench/bench_async.py --sides sync,async       # leave out the interpolate variant

Each run is ``areno train --recipe math/arith --algo gspo`` in its own process, stopped with
Ctrl-C (SIGINT) ``--budget`` seconds after it was launched; areno then finishes the step in
flight, saves it and exits. Sides:

* ``sync``: the default, rollout and training alternate in one process;
* ``async``: ``--async-rollout`` (``--max-staleness 1``): rollout in a worker process, the
  decoupled objective with the exact proximal pass (``--proximal-logprobs recompute``);
* ``async-interpolate``: the same with ``--proximal-logprobs interpolate`` (no extra pass).

Every side gets the same CPU threads (``--threads``, default 2: the whole 2-core machine, as
the demo runs): the synchronous run uses them all in turn, the asynchronous one gives half to
the rollout worker and half to the trainer. Runs alternate sides (A B C, C B A, ...).

Reported per run: steps done; samples per second over the whole run (launch to exit: startup,
the step-0 evaluation and the final save included) and in steady state (the loop's
``time/step`` over every step after the second); CPU seconds of the run and its children
(trainer and worker) per sample, over the whole run and in steady state (from the moment step 2
is logged to the moment the last step is, read from ``/proc`` on Linux); held-out greedy
accuracy of the last checkpoint on the recipe's 500 problems, evaluated afterwards, outside
the budget; the load average before and after; for asynchronous runs the weight transfer
cost (``time/weight_sync`` in the trainer, ``time/weight_load`` in the worker) and the time
the trainer waited for rollouts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SIDES: dict[str, list[str]] = {
    "sync": [],
    "async": ["--async-rollout", "--max-staleness", "1", "--proximal-logprobs", "recompute"],
    "async-interpolate": [
        "--async-rollout", "--max-staleness", "1", "--proximal-logprobs", "interpolate",
    ],
}  # fmt: skip
STEADY_KEYS = (
    ("steady_samples_per_s", "samples/s in steady state"),
    ("samples_per_s", "samples/s over the run"),
    ("steady_cpu_s_per_sample", "CPU s/sample in steady state"),
    ("cpu_s_per_sample", "CPU s/sample over the run"),
)
SAMPLES_PER_STEP = 32 * 8  # the recipe's --batch-size x --n-samples


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_side(side: str, budget: float, threads: int, root: Path, max_steps: int | None) -> dict:
    """One run of ``side``: train for ``budget`` seconds (or ``max_steps``), then evaluate."""
    out = root / f"{side}-{time.monotonic_ns()}"
    command = [
        sys.executable, "-m", "areno_core.cli.main", "train", "--recipe", "math/arith",
        "--algo", "gspo", "--save-path", str(out), "--eval-interval", "1000000",
        *SIDES[side],
    ]  # fmt: skip
    if max_steps is not None:
        command += ["--max-steps", str(max_steps)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": common._pythonpath()}
    load_before = common.load_average()
    cpu_before = _children_cpu_s()
    launched = time.perf_counter()
    log = (root / f"{out.name}.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    # SIGINT after the budget: areno finishes the step in flight, saves it and stops. The
    # process tree's CPU time is read at each logged step.
    marks = common.watch_run(proc, out / "tensorboard" / "metrics.jsonl", interrupt_after=budget)
    wall = time.perf_counter() - launched
    cpu = _children_cpu_s() - cpu_before
    log.close()
    if proc.returncode not in (0, 130):
        tail = (root / f"{out.name}.log").read_text().splitlines()[-30:]
        raise RuntimeError(f"{side} run failed (rc={proc.returncode}):\n" + "\n".join(tail))
    rows = [r for r in common.read_jsonl(out / "tensorboard" / "metrics.jsonl") if r["step"] > 0]
    steps = len(rows)
    steady = [r["time/step"] for r in rows[2:]]
    result: dict[str, Any] = {
        "side": side,
        "steps": steps,
        "wall_s": wall,
        "samples_per_s": steps * SAMPLES_PER_STEP / wall,
        "steady_samples_per_s": len(steady) * SAMPLES_PER_STEP / sum(steady) if steady else 0.0,
        "cpu_s": cpu,
        "cpu_s_per_sample": cpu / max(steps * SAMPLES_PER_STEP, 1),
        # From the moment step 2 was logged to the moment the last one was (Linux: /proc):
        # the steady state's CPU time, without the worker's start, the last save and the exit.
        "steady_cpu_s_per_sample": None
        if (span := common.steady_cpu(marks)) is None
        else span[2] / ((span[1] - span[0]) * SAMPLES_PER_STEP),
        "reward_last20": common.median([r["rollout/reward_mean"] for r in rows[-20:]] or [0.0]),
        "load_before": load_before,
        "load_after": common.load_average(),
        "accuracy": evaluate(out),
    }
    for key in (
        "time/rollout", "time/train", "time/weight_sync", "time/weight_load",
        "time/rollout_wait", "time/proximal",
    ):  # fmt: skip
        values = [r[key] for r in rows[2:] if key in r]
        if values:
            result[key] = common.median(values)
    return result


def steady_state_bound(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Where a step's time goes, and the most an asynchronous side could gain in steady state.

    A synchronous step is rollout + train (``time/rollout`` + ``time/train``). An asynchronous
    step can be no shorter than its trainer's step, whose ``time/train`` includes the proximal
    pass (``time/proximal``); while the trainer never waits for rollouts
    (``time/rollout_wait`` about 0) it *is* the step. So, per pair of medians, the gain is at
    most (sync rollout + sync train) / async train, and would be at most (sync rollout + sync
    train) / (async train - proximal) were the proximal pass free.
    """
    sync = results.get("sync") or []
    if not sync or "time/train" not in sync[0]:
        return []
    rollout = common.median([r["time/rollout"] for r in sync])
    train = common.median([r["time/train"] for r in sync])
    lines = [
        "",
        f"steady state, median s/step: sync rollout {rollout:.4f} + train {train:.4f} "
        f"(rollout is {rollout / (rollout + train):.0%} of the step)",
    ]
    for side, runs in results.items():
        if side == "sync" or not runs or "time/train" not in runs[0]:
            continue
        async_train = common.median([r["time/train"] for r in runs])
        proximal = common.median([r.get("time/proximal", 0.0) for r in runs])
        wait = common.median([r.get("time/rollout_wait", 0.0) for r in runs])
        bound = (rollout + train) / async_train
        free = (rollout + train) / max(async_train - proximal, 1e-9)
        lines.append(
            f"{side}: trainer step {async_train:.4f} (proximal pass {proximal:.4f}), waited "
            f"{wait:.4f} for rollouts: at most {bound:.2f}x sync in steady state, "
            f"{free:.2f}x with a free proximal pass"
        )
    return lines


def evaluate(run: Path) -> float:
    """Greedy held-out accuracy of the run's last checkpoint (a separate process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "areno_recipes_math.evaluate", "--ckpt", str(run)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": common._pythonpath()},
        check=True,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("accuracy "):
            return float(line.split()[1])
    raise RuntimeError(f"no accuracy line in:\n{proc.stdout}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per side")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds per run")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads per run (OMP)")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated sides")
    parser.add_argument("--max-steps", type=int, default=None, help="stop runs after N steps")
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    args = parser.parse_args(argv)
    sides = args.sides.split(",")
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"unknown side(s) {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    print(f"math/arith gspo, {args.budget:g} s per run, {args.threads} threads, sides {sides}")
    with tempfile.TemporaryDirectory(prefix="areno-bench-async-") as tmp:
        results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for rep in range(args.reps):
            order = sides if rep % 2 == 0 else sides[::-1]
            for side in order:
                result = run_side(side, args.budget, args.threads, Path(tmp), args.max_steps)
                results[side].append(result)
                print(
                    f"  rep {rep + 1}/{args.reps} {side:<17} steps={result['steps']} "
                    f"samples/s={result['samples_per_s']:.1f} "
                    f"steady={result['steady_samples_per_s']:.1f} "
                    f"acc={result['accuracy']:.3f} cpu/sample={result['cpu_s_per_sample']:.4f} "
                    f"steady cpu/sample={common.maybe(result['steady_cpu_s_per_sample'], 5)} "
                    f"load={result['load_before']:.1f}->{result['load_after']:.1f}",
                    flush=True,
                )
    rows = []
    for side, runs in results.items():

        def spread(key: str, runs: list[dict[str, Any]] = runs) -> str:
            values = [r[key] for r in runs]
            return f"{common.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"

        rows.append(
            [
                side,
                spread("steps"),
                spread("samples_per_s"),
                spread("steady_samples_per_s"),
                spread("cpu_s_per_sample"),
                common.steady_cpu_column(runs),
                spread("accuracy"),
                f"{min(r['load_before'] for r in runs):.1f}-"
                f"{max(r['load_after'] for r in runs):.1f}",
            ]
        )
    headers = ["side", "steps", "samples/s (run)", "samples/s (steady)", "CPU s/sample (run)",
               "CPU s/sample (steady)", "held-out accuracy", "load"]  # fmt: skip
    print("\nmedian (min-max) over runs:")
    print(common.table(headers, rows))
    for line in common.against(results, "sync", STEADY_KEYS) + steady_state_bound(results):
        print(line)
    payload = {"machine": common.machine_info(args.threads), "args": vars(args), "runs": results}
    common.write_json(args.json, json.loads(json.dumps(payload, default=str)))
    return payload


if __name__ == "__main__":
    main()

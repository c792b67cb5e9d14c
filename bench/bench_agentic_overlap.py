"""Agentic batches in flight together (``--max-inflight-batches``) against one at a time, on an
agent whose episodes take uneven time.

    python bench/bench_agentic_overlap.py                    # 3 runs per side, 14 steps each
    python bench/bench_agentic_overlap.py --reps 5 --slow-s 2 --json runs/bench/overlap.json

Each run is ``areno train --algo grpo`` on ``random:qwen3-tiny`` with the agent of
tests/fixtures/seeded_agent.py: one chat request per sample, where every ``--slow-every``-th
sample first waits ``--slow-s`` seconds in a pretend tool call (``asyncio.sleep``, no CPU), so
each batch has a straggler. Sides (runs alternate A B C, C B A, ...):

* ``sync``: rollout and training alternate in one process;
* ``async-1``: ``--async-rollout --max-staleness K --max-inflight-batches 1``;
* ``async-2``: the same with ``--max-inflight-batches 2``;
* ``fill-1``, ``fill-2``: ``async-1`` and ``async-2`` with ``--step-fill completion`` (a step
  trains on the first groups to finish, from any batch sent to the worker; not run by default,
  ask for them with ``--sides``).

Each sample's agent makes its client with ``ctx.openai_client(item)``; a side named with
``+plain`` (``sync+plain``, ``fill-2+plain``) makes a plain ``openai.AsyncOpenAI`` per sample
instead, which builds a TLS context and loads the system's certificates each time (about 50 ms
of CPU), as an agent written without areno in mind does.

``K`` is ``--max-staleness`` (default 2): the worker starts a batch beside one in flight only
while no newer weights have arrived, and with ``K = 1`` the rows of the next step arrive
together with newer weights, so batches overlap only at the start of the run (see
docs/async.md).

Reported per run: samples per second over the whole run (launch to exit, startup included)
and in steady state (the loop's ``time/step`` over every step after the second), CPU seconds
of the run and its children (trainer and worker) per sample, over the whole run (startup
included) and in steady state (from the moment step 2 is logged to the moment the last step
is, read from ``/proc`` on Linux), and for asynchronous runs the share of batches that started
while another was in flight (``rollout/inflight_batches`` above 1).
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

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "tests" / "fixtures" / "seeded_agent.py"
REWARD = REPO / "tests" / "fixtures" / "digit_share_reward.py"
GSM8K = REPO / "data" / "gsm8k" / "train.jsonl"
SIDES = ("sync", "async-1", "async-2", "fill-1", "fill-2")
DEFAULT_SIDES = ("sync", "async-1", "async-2")
BATCH, N_SAMPLES = 4, 4


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def write_inputs(root: Path, rows: int) -> tuple[Path, Path]:
    data, loader = root / "rows.jsonl", root / "loader.py"
    with GSM8K.open() as f:
        data.write_text("".join(next(f) for _ in range(rows)))
    loader.write_text("def load_row(row):\n    return {'prompt': row['question'][:48]}\n")
    return data, loader


def run_side(side: str, args: argparse.Namespace, root: Path, data: Path, loader: Path) -> dict:
    base, _, variant = side.partition("+")
    out = root / f"{base}-{variant or 'ctx'}-{time.monotonic_ns()}"
    command = [
        sys.executable, "-m", "areno_core.cli.main", "train", "--algo", "grpo",
        "--ckpt", "random:qwen3-tiny", "--dataset-path", str(data),
        "--dataset-loader-fn", str(loader), "--reward-fn-path", str(REWARD),
        "--agent-fn", str(AGENT), "--batch-size", str(BATCH), "--n-samples", str(N_SAMPLES),
        "--mini-bs", str(BATCH * N_SAMPLES), "--max-new-tokens", str(args.max_new_tokens),
        "--max-steps", str(args.steps), "--no-activation-checkpointing",
        "--metrics-log-dir", str(out),
    ]  # fmt: skip
    if base != "sync":
        command += ["--async-rollout", "--max-staleness", str(args.max_staleness),
                    "--max-inflight-batches", base.split("-")[1]]  # fmt: skip
    if base.startswith("fill-"):
        command += ["--step-fill", "completion"]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "PYTHONPATH": common._pythonpath(),
        "SEEDED_AGENT_SLOW_EVERY": str(args.slow_every),
        "SEEDED_AGENT_SLOW_S": str(args.slow_s),
        "SEEDED_AGENT_PLAIN_CLIENT": "1" if variant == "plain" else "0",
    }
    load_before = common.load_average()
    cpu_before = _children_cpu_s()
    launched = time.perf_counter()
    # Watch the metrics while it runs: the process tree's CPU time at each logged step.
    log = out.with_suffix(".log")
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        marks = common.watch_run(proc, out / "metrics.jsonl")
    wall = time.perf_counter() - launched
    cpu = _children_cpu_s() - cpu_before
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{side} run failed (rc={proc.returncode}):\n{tail}")
    rows = [r for r in common.read_jsonl(out / "metrics.jsonl") if r["step"] > 0]
    samples = sum(r["rollout/samples"] for r in rows)
    steady = rows[2:]
    steady_s = sum(r["time/step"] for r in steady)
    result: dict[str, Any] = {
        "side": side,
        "steps": len(rows),
        "wall_s": wall,
        "samples_per_s": samples / wall,
        "steady_samples_per_s": sum(r["rollout/samples"] for r in steady) / steady_s,
        "cpu_s": cpu,
        "cpu_s_per_sample": cpu / max(samples, 1),
        # From the moment step 2 was logged to the moment the last one was: the steady
        # state's CPU time, without the processes' start, the last save and the shutdown.
        "steady_cpu_s_per_sample": _steady_cpu_per_sample(marks, rows),
        "load_before": load_before,
        "load_after": common.load_average(),
    }
    inflight = [r["rollout/inflight_batches"] for r in rows if "rollout/inflight_batches" in r]
    if inflight:  # the share of batches that started beside another
        result["overlapped_share"] = sum(v > 1 for v in inflight) / len(inflight)
    return result


def _steady_cpu_per_sample(marks: list[tuple[int, float]], rows: list[dict]) -> float | None:
    steady = common.steady_cpu(marks)
    if steady is None:
        return None
    a, b, cpu = steady
    return cpu / max(sum(r["rollout/samples"] for r in rows[a:b]), 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per side")
    parser.add_argument("--steps", type=int, default=14, help="train steps per run")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads per run (OMP)")
    parser.add_argument("--max-staleness", type=int, default=2, help="K of the async sides")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--slow-every", type=int, default=BATCH * N_SAMPLES,
                        help="every N-th sample is slow (default: one per batch)")  # fmt: skip
    parser.add_argument("--slow-s", type=float, default=1.5, help="seconds a slow sample waits")
    parser.add_argument(
        "--sides",
        default=",".join(DEFAULT_SIDES),
        help=f"comma-separated sides, of {', '.join(SIDES)} (default %(default)s)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    args = parser.parse_args(argv)
    sides = args.sides.split(",")
    unknown = sorted(
        side
        for side in sides
        if side.partition("+")[0] not in SIDES or side.partition("+")[2] not in ("", "plain")
    )
    if unknown:
        parser.error(
            f"unknown side(s) {', '.join(unknown)}; choose from {', '.join(SIDES)}, each "
            "optionally with +plain"
        )
    for name in ("reps", "threads", "slow_every"):
        value = getattr(args, name)
        if value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.steps < 4:
        parser.error(f"--steps must be at least 4 (steady state from step 3 on), got {args.steps}")
    if args.max_staleness < 0:
        parser.error(f"--max-staleness must be at least 0, got {args.max_staleness}")
    print(
        f"agentic grpo, random:qwen3-tiny, {BATCH}x{N_SAMPLES} samples a step, "
        f"{args.steps} steps, every {args.slow_every}th sample waits {args.slow_s:g} s, "
        f"K={args.max_staleness}, {args.threads} threads, sides {sides}"
    )
    with tempfile.TemporaryDirectory(prefix="areno-bench-overlap-") as tmp:
        root = Path(tmp)
        data, loader = write_inputs(root, BATCH * args.steps)
        results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for rep in range(args.reps):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                result = run_side(side, args, root, data, loader)
                results[side].append(result)
                print(
                    f"  rep {rep + 1}/{args.reps} {side:<14} "
                    f"samples/s={result['samples_per_s']:.2f} "
                    f"steady={result['steady_samples_per_s']:.2f} "
                    f"cpu/sample={result['cpu_s_per_sample']:.3f} "
                    f"steady cpu/sample={common.maybe(result['steady_cpu_s_per_sample'], 3)} "
                    f"overlapped={result.get('overlapped_share', 0.0):.2f} "
                    f"load={result['load_before']:.1f}->{result['load_after']:.1f}",
                    flush=True,
                )
    rows = []
    for side, runs in results.items():
        rows.append(
            [
                side,
                common.spread([r["samples_per_s"] for r in runs]),
                common.spread([r["steady_samples_per_s"] for r in runs]),
                common.spread([r["cpu_s_per_sample"] for r in runs]),
                common.steady_cpu_column(runs),
                common.spread([r.get("overlapped_share", 0.0) for r in runs]),
                f"{min(r['load_before'] for r in runs):.1f}-"
                f"{max(r['load_after'] for r in runs):.1f}",
            ]
        )
    headers = ["side", "samples/s (run)", "samples/s (steady)", "CPU s/sample (run)",
               "CPU s/sample (steady)", "batches started beside another", "load"]  # fmt: skip
    print("\nmedian (min-max) over runs:")
    print(common.table(headers, rows))
    keys = (
        ("steady_samples_per_s", "samples/s in steady state"),
        ("samples_per_s", "samples/s over the run"),
        ("steady_cpu_s_per_sample", "CPU s/sample in steady state"),
        ("cpu_s_per_sample", "CPU s/sample over the run"),
    )
    reference = "sync" if "sync" in results else sides[0]
    for line in common.against(results, reference, keys):
        print(line)
    payload = {"machine": common.machine_info(args.threads), "args": vars(args), "runs": results}
    common.write_json(args.json, json.loads(json.dumps(payload, default=str)))
    return payload


if __name__ == "__main__":
    main()

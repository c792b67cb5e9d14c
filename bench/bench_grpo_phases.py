"""areno's GRPO step, configurations side by side in one process, CPU time per phase.

    python bench/bench_grpo_phases.py --shape tiny --steps 40 \\
        --config packed=off,shared=on --config packed=auto,shared=auto

Whole runs of the same code spread by 15% or more from one process to the next on a shared
2-vCPU guest, which hides a change of a few percent. Here each ``--config`` gets its own copy
of the same saved random model (and its own engine and backend), and the configurations take
their steps in turn, step by step, in one process; each step's rollout and update are timed
with the process's CPU clock. A configuration sets the local backend's ``packed_forward`` and
the native engine's ``shared_prompt_cache`` (``on``, ``off`` or ``auto``, areno's default);
everything else is the areno side of ``bench_grpo.py`` (its shapes, prompts, reward and
update settings). Configurations that compute the same numbers end on the same rewards; the
last column shows it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_grpo
import common

SETTINGS = {"on": True, "off": False, "auto": None}
KEYS = {"packed": "packed_forward", "shared": "shared_prompt_cache"}


def parse_config(text: str) -> dict[str, bool | None]:
    """``packed=off,shared=on`` -> ``{"packed_forward": False, "shared_prompt_cache": True}``
    (unnamed keys stay ``auto``)."""
    config: dict[str, bool | None] = dict.fromkeys(KEYS.values())
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in KEYS or value not in SETTINGS:
            raise argparse.ArgumentTypeError(
                f"--config {text!r}: expected comma-separated key=value with keys "
                f"{'/'.join(KEYS)} and values {'/'.join(SETTINGS)}, got {part!r}"
            )
        config[KEYS[key]] = SETTINGS[value]
    return config


def label(config: dict[str, bool | None]) -> str:
    names = {v: k for k, v in SETTINGS.items()}
    return ",".join(f"{short}={names[config[key]]}" for short, key in KEYS.items())


def build_side(model_dir: Path, config: dict[str, bool | None]) -> dict[str, Any]:
    model, backend, engine, scorer = bench_grpo.areno_parts(model_dir, 0, **config)
    return {
        "label": label(config),
        "model": model,
        "backend": backend,
        "engine": engine,
        "scorer": scorer,
        "rollout_ms": [],
        "update_ms": [],
        "rewards": [],
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    common.set_threads(args.threads)
    from areno_core.types import SamplingParams

    shape = dict(bench_grpo.SHAPES[args.shape])
    shape["steps"] = args.steps
    rows = bench_grpo.workload_rows(args.shape, shape)
    sampling = SamplingParams(max_new_tokens=shape["new_tokens"], temperature=1.0)
    with tempfile.TemporaryDirectory(prefix="areno-bench-") as tmp:
        model_dir = common.save_random_model(shape["model"], Path(tmp) / "model")
        sides = [build_side(model_dir, config) for config in args.config]
    for step in range(shape["warmup"] + shape["steps"]):
        for side in sides:
            began = time.process_time()
            groups, metrics = bench_grpo.areno_rollout(
                step, rows, shape, side["model"], side["engine"], sampling, side["scorer"]
            )
            rolled = time.process_time()
            bench_grpo.areno_update(
                side["backend"], side["model"], groups, shape, checkpointing=None
            )
            side["engine"].sync_weights(side["model"].policy, version=side["model"].optimizer_steps)
            done = time.process_time()
            side["rewards"].append(metrics["rollout/reward_mean"])
            if step >= shape["warmup"]:
                side["rollout_ms"].append((rolled - began) * 1e3)
                side["update_ms"].append((done - rolled) * 1e3)
    return [summary(side) for side in sides]


def summary(side: dict[str, Any]) -> dict[str, Any]:
    steps = [r + u for r, u in zip(side["rollout_ms"], side["update_ms"], strict=True)]
    return {
        "config": side["label"],
        "rollout_ms": statistics.median(side["rollout_ms"]),
        "update_ms": statistics.median(side["update_ms"]),
        "step_ms": statistics.median(steps),
        "step_ms_min": min(steps),
        "step_ms_max": max(steps),
        "reward_last3": sum(side["rewards"][-3:]) / len(side["rewards"][-3:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(bench_grpo.SHAPES), default="tiny")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--config",
        type=parse_config,
        action="append",
        required=True,
        help="one configuration, e.g. packed=off,shared=on (repeat for each side)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    results = run(args)
    print(
        f"machine: {common.machine_info(args.threads)}; load {common.load_average():.2f}\n"
        f"GRPO shape {args.shape}, {args.steps} timed steps per configuration, alternating; "
        "median ms of CPU per step"
    )
    print(
        common.table(
            ["configuration", "rollout", "update", "whole step (min-max)", "reward, last 3 steps"],
            [
                [
                    r["config"],
                    f"{r['rollout_ms']:.1f}",
                    f"{r['update_ms']:.1f}",
                    f"{r['step_ms']:.1f} ({r['step_ms_min']:.1f}-{r['step_ms_max']:.1f})",
                    f"{r['reward_last3']:.3f}",
                ]
                for r in results
            ],
        )
    )
    common.write_json(args.json, {"results": results})


if __name__ == "__main__":
    main()

"""The GPU acceptance check: ``python -m areno_core.gpu_check`` (or ``bash scripts/gpu_check.sh``).

Proves the GPU paths in minutes on one CUDA GPU, with no network: the ``gpu``-marked tests;
short bf16 GRPO runs on a random model of Qwen3-0.6B's shape with the native engine (CUDA-graph
decode on and off, flash-attn when importable, SDPA otherwise); the memory hand-off between
rollout and training (``--drop-rollout-state --offload-optimizer``); ``--tune-params``; the
same run with the ``sglang`` engine when sglang is importable; and decode tokens/s of
transformers' ``generate`` on the same model and GPU. Prints one table and writes
``gpu_check.json`` and ``gpu_check.md`` under ``--out``.

    python -m areno_core.gpu_check --out runs/gpu-check
    python -m areno_core.gpu_check --dry-run           # the plan of steps, on any machine

On a machine without CUDA it exits at once (status 3) naming what is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from areno_core.models.scratch import build_random_model

REPO = Path(__file__).resolve().parents[1]
NO_CUDA_EXIT = 3
# A random Qwen3 of Qwen3-0.6B's layer shapes (the vocabulary is the byte tokenizer's).
QWEN3_06B_SHAPE = (
    "random:qwen3?hidden_size=1024&num_hidden_layers=28&num_attention_heads=16"
    "&num_key_value_heads=8&head_dim=128&intermediate_size=3072"
)
LOADER = """
def load_row(row):
    return {"prompt": row["question"], "answer": row["answer"].split("####")[-1].strip()}
"""
REWARD = """
def reward_fn(record):
    return float(record.answer is not None and record.answer in record.completion)
"""


@attrs.define
class StepResult:
    """One row of the table: ``status`` is ok, failed or skipped (``reason`` says why)."""

    name: str
    status: str
    seconds: float = 0.0
    reason: str = ""
    metrics: dict[str, float] = attrs.Factory(dict)


@attrs.frozen
class Step:
    name: str
    what: str
    run: Callable[[Context], StepResult]
    needs: str | None = None  # an importable module, else the step is skipped


@attrs.frozen
class Context:
    out: Path
    ckpt: str
    steps: int
    python: str
    timeout_s: float


def cuda_problem() -> str | None:
    """Why this machine cannot run the check, or None."""
    if not torch.cuda.is_available():
        build = torch.version.cuda
        if build is None:
            return f"torch {torch.__version__} is a CPU-only build (no CUDA support)"
        return f"torch {torch.__version__} (CUDA {build}) finds no CUDA GPU on this machine"
    return None


def attention_backend() -> str:
    """What the runs use: flash-attn when importable, torch SDPA otherwise."""
    return "flash" if importable("flash_attn") else "sdpa"


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# -- runs ------------------------------------------------------------------------------------


def grpo_args(ctx: Context, run: Path, *extra: str) -> list[str]:
    """The run's command line; under ``--tune-params`` without the sizes the tuner picks."""
    data = ctx.out / "data"
    sizes = [] if "--tune-params" in extra else ["--batch-size", "8", "--mini-bs", "8"]
    return [
        "train", "--algo", "grpo", "--ckpt", ctx.ckpt, "--dtype", "bfloat16",
        "--dataset-path", str(data / "rows.jsonl"),
        "--dataset-loader-fn", str(data / "loader.py"), "--reward-fn-path", str(data / "reward.py"),
        *sizes, "--n-samples", "4",
        "--gradient-accumulation-steps", "1", "--max-prompt-tokens", "256",
        "--max-new-tokens", "128", "--max-steps", str(ctx.steps), "--lr", "1e-6",
        "--attn-backend", "flash" if attention_backend() == "flash" else "native",
        "--save-path", str(run), "--save-interval", "1000000",
        *extra,
    ]  # fmt: skip


def write_inputs(ctx: Context) -> None:
    """A loader, a reward and 64 GSM8K rows (from the repository) beside the runs: rows whose
    question fits ``--max-prompt-tokens 256`` with the byte tokenizer (a token per byte, plus
    the chat template), so every step samples all of its prompts."""
    data = ctx.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    lines = (REPO / "data" / "gsm8k" / "train.jsonl").read_text().splitlines(keepends=True)
    short = [line for line in lines if len(json.loads(line)["question"].encode()) <= 200]
    (data / "rows.jsonl").write_text("".join(short[:64]))
    (data / "loader.py").write_text(LOADER)
    (data / "reward.py").write_text(REWARD)


def summarize_run(run: Path) -> dict[str, float]:
    """Step time, peak memory, decode tokens/s and the rollout-vs-training log-probability
    agreement of a finished run, from its ``metrics.jsonl`` (the first step, which records
    graphs and warms kernels up, is left out of the timings when there are more)."""
    lines = (run / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    if not rows:
        raise ValueError(f"{run}: metrics.jsonl is empty")
    timed = rows[1:] or rows

    def mean(key: str) -> float:
        values = [r[key] for r in timed if key in r]
        return sum(values) / len(values) if values else float("nan")

    tokens = [r["rollout/samples"] * r["rollout/response_length_mean"] for r in timed]
    rollout_s = [r.get("time/rollout", float("nan")) for r in timed]
    out = {
        "steps": float(len(rows)),
        "step_s": mean("time/step"),
        "decode_tokens_per_s": sum(tokens) / sum(rollout_s) if sum(rollout_s) else float("nan"),
        "train_tokens_per_s": mean("train/tokens_per_s"),
        "rollout_peak_mib": max(r.get("memory/rollout_peak_mib", 0.0) for r in rows),
        "train_peak_mib": max(r.get("memory/train_peak_mib", 0.0) for r in rows),
        "rollout_state_mib": max(r.get("memory/rollout_state_mib", 0.0) for r in rows),
    }
    # One optimizer step per trainer step: its ratios compare the training forward with the
    # rollout's log-probabilities of the same tokens under the same weights.
    first = rows[0]
    if "train/ratio_min" in first:
        out["ratio_min"] = first["train/ratio_min"]
        out["ratio_max"] = first["train/ratio_max"]
    return out


def areno_run(ctx: Context, name: str, *extra: str) -> StepResult:
    run = ctx.out / name
    args = grpo_args(ctx, run, *extra)
    started = time.monotonic()
    proc = subprocess.run(
        [ctx.python, "-m", "areno_core.cli", *args],
        capture_output=True, text=True, timeout=ctx.timeout_s, cwd=str(REPO),
    )  # fmt: skip
    seconds = time.monotonic() - started
    (ctx.out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["(no output)"]
        return StepResult(name, "failed", seconds, f"exit {proc.returncode}: {tail[0][:200]}")
    return StepResult(name, "ok", seconds, metrics=summarize_run(run))


def gpu_test_files() -> list[str]:
    """The test files that hold ``gpu``-marked tests. Only these are collected, so a GPU
    machine without the optional packages other test files import (trl, verifiers, ...)
    still runs every GPU test. A plugin's tests are left out when the plugin is not installed
    (:func:`plugins_not_installed`): its test folder imports it."""
    missing = set(plugins_not_installed())
    return [str(f.relative_to(REPO)) for f in _marked_files() if _plugin_of(f) not in missing]


def _marked_files() -> list[Path]:
    files = sorted([*REPO.glob("tests/**/test_*.py"), *REPO.glob("plugins/*/tests/**/test_*.py")])
    return [f for f in files if "mark.gpu" in f.read_text()]


def plugins_not_installed() -> list[str]:
    """The repository's plugins (``plugins/<name>``) whose package is not importable here."""
    return sorted(
        d.name
        for d in REPO.glob("plugins/*")
        if (d / "tests").is_dir() and not importable(d.name.replace("-", "_"))
    )


def _plugin_of(path: Path) -> str | None:
    parts = path.relative_to(REPO).parts
    return parts[1] if parts[0] == "plugins" else None


def gpu_tests(ctx: Context) -> StepResult:
    report = ctx.out / "gpu_tests.xml"
    started = time.monotonic()
    proc = subprocess.run(
        [ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
         f"--junitxml={report}", *gpu_test_files()],
        capture_output=True, text=True, timeout=ctx.timeout_s, cwd=str(REPO),
    )  # fmt: skip
    seconds = time.monotonic() - started
    (ctx.out / "gpu_tests.log").write_text(proc.stdout + proc.stderr)
    counts = junit_counts(report) if report.is_file() else {}
    status = "ok" if proc.returncode == 0 else "failed"
    reason = "" if status == "ok" else "see gpu_tests.log"
    marked = {_plugin_of(f) for f in _marked_files()}
    left_out = [p for p in plugins_not_installed() if p in marked]
    if left_out:
        note = f"not installed, their gpu tests not run: {', '.join(left_out)}"
        reason = f"{reason}; {note}" if reason else note
    return StepResult("gpu_tests", status, seconds, reason, counts)


def junit_counts(path: Path) -> dict[str, float]:
    """Passed, failed and skipped counts of a pytest JUnit XML report."""

    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in total:
            total[key] += int(suite.get(key, 0))
    failed = total["failures"] + total["errors"]
    return {
        "passed": float(total["tests"] - failed - total["skipped"]),
        "failed": float(failed),
        "skipped": float(total["skipped"]),
    }


def generate_baseline(ctx: Context) -> StepResult:
    """Decode tokens/s of transformers' ``generate`` on the same model, rows and lengths."""

    started = time.monotonic()
    model = build_random_model(ctx.ckpt, dtype=torch.bfloat16).to("cuda")
    rows, prompt, new = 32, 256, 128
    ids = torch.randint(3, model.config.vocab_size, (rows, prompt), device="cuda")
    kwargs = {"do_sample": True, "max_new_tokens": new, "min_new_tokens": new, "pad_token_id": 0}
    with torch.no_grad():
        model.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        torch.cuda.synchronize()
        begin = time.monotonic()
        model.generate(ids, **kwargs)
        torch.cuda.synchronize()
        elapsed = time.monotonic() - begin
    return StepResult(
        "generate_baseline",
        "ok",
        time.monotonic() - started,
        metrics={"decode_tokens_per_s": rows * new / elapsed},
    )


STEPS: tuple[Step, ...] = (
    Step("gpu_tests", "pytest -m gpu over the test files that hold gpu tests", gpu_tests),
    Step(
        "grpo_graphs",
        "bf16 GRPO, native engine, CUDA-graph decode",
        lambda ctx: areno_run(ctx, "grpo_graphs"),
    ),
    Step(
        "grpo_eager",
        "the same with --eager-decode",
        lambda ctx: areno_run(ctx, "grpo_eager", "--eager-decode"),
    ),
    Step(
        "grpo_handoff",
        "the same with --drop-rollout-state --offload-optimizer",
        lambda ctx: areno_run(ctx, "grpo_handoff", "--drop-rollout-state", "--offload-optimizer"),
    ),
    Step("generate_baseline", "decode tokens/s of transformers generate", generate_baseline),
    Step(
        "grpo_tune",
        "the GRPO run with --tune-params",
        lambda ctx: areno_run(ctx, "grpo_tune", "--tune-params", "--tune-max-samples", "64"),
    ),
    Step(
        "grpo_sglang",
        "the GRPO run with --rollout-engine sglang (colocated)",
        lambda ctx: areno_run(ctx, "grpo_sglang", "--rollout-engine", "sglang"),
        needs="sglang",
    ),
)


def plan_steps(only: Sequence[str] | None = None) -> list[tuple[Step, str | None]]:
    """The steps to run, each with the reason it will be skipped (None: it runs)."""
    names = [s.name for s in STEPS]
    unknown = [n for n in (only or ()) if n not in names]
    if unknown:
        raise SystemExit(
            f"--only {', '.join(unknown)}: unknown step; the steps are {', '.join(names)}"
        )
    chosen = [s for s in STEPS if not only or s.name in only]
    return [
        (s, None if s.needs is None or importable(s.needs) else f"{s.needs} is not importable")
        for s in chosen
    ]


# -- output ----------------------------------------------------------------------------------

COLUMNS = (
    ("step_s", "step s", "{:.2f}"),
    ("decode_tokens_per_s", "decode tok/s", "{:,.0f}"),
    ("train_tokens_per_s", "train tok/s", "{:,.0f}"),
    ("rollout_peak_mib", "rollout peak MiB", "{:,.0f}"),
    ("train_peak_mib", "train peak MiB", "{:,.0f}"),
    ("ratio_min", "ratio min", "{:.4f}"),
    ("ratio_max", "ratio max", "{:.4f}"),
)


def markdown_table(results: Sequence[StepResult]) -> str:
    """The results as one Markdown table (empty cells where a step has no such number)."""
    head = ["step", "status", "seconds", *(label for _, label, _ in COLUMNS), "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        cells = [r.name, r.status, f"{r.seconds:.0f}"]
        for key, _, fmt in COLUMNS:
            cells.append(fmt.format(r.metrics[key]) if key in r.metrics else "")
        extra = {k: v for k, v in r.metrics.items() if k in ("passed", "failed", "skipped")}
        note = r.reason or ", ".join(f"{int(v)} {k}" for k, v in extra.items())
        cells.append(note)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(out: Path, results: Sequence[StepResult], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    payload = {**meta, "steps": [attrs.asdict(r) for r in results]}
    (out / "gpu_check.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown_table(results))


def machine() -> dict[str, Any]:

    info: dict[str, Any] = {"torch": torch.__version__, "attention": attention_backend()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_mib=props.total_memory // 2**20, cuda=torch.version.cuda)
    return info


# -- entry point -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m areno_core.gpu_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/gpu-check"), help="where the table, JSON and logs go"
    )
    parser.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps")
    parser.add_argument(
        "--ckpt",
        default=QWEN3_06B_SHAPE,
        help="model of the runs (default: a random Qwen3-0.6B shape)",
    )
    parser.add_argument("--steps", type=int, default=3, help="trainer steps per run (default 3)")
    parser.add_argument("--step-timeout-s", type=float, default=240.0, help="limit per step")
    parser.add_argument(
        "--budget-s", type=float, default=570.0, help="limit for all steps (default 570)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the steps and exit")
    parser.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)  # tests
    args = parser.parse_args(argv)
    if args.steps < 1 or args.step_timeout_s <= 0 or args.budget_s <= 0:
        parser.error(
            f"--steps {args.steps} / --step-timeout-s {args.step_timeout_s}: expected "
            "positive values"
        )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    planned = plan_steps(args.only)
    if args.dry_run:
        for step, skip in planned:
            print(f"{step.name:18s} {step.what}" + (f"  [skipped: {skip}]" if skip else ""))
        return 0
    problem = cuda_problem()
    if problem is not None and not args.allow_cpu:
        print(
            f"gpu_check needs a CUDA GPU: {problem}. Run it on a machine with an NVIDIA GPU and "
            "a CUDA build of torch (`python -m areno_core.gpu_check --dry-run` lists its steps).",
            file=sys.stderr,
        )
        return NO_CUDA_EXIT
    write_inputs(Context(args.out, args.ckpt, args.steps, sys.executable, args.step_timeout_s))
    deadline = time.monotonic() + args.budget_s
    results = []
    for step, skip in planned:
        left = deadline - time.monotonic()
        if skip is None and left < 10:
            skip = f"the --budget-s of {args.budget_s:g} s was spent"
        if skip is not None:
            results.append(StepResult(step.name, "skipped", reason=skip))
            continue
        limit = min(args.step_timeout_s, left)
        ctx = Context(args.out, args.ckpt, args.steps, sys.executable, limit)
        try:
            result = step.run(ctx)
        except subprocess.TimeoutExpired:
            result = StepResult(step.name, "failed", limit, f"timed out after {limit:.0f} s")
        except Exception as exc:  # one broken step must not hide the others' results
            result = StepResult(step.name, "failed", reason=f"{type(exc).__name__}: {exc}"[:200])
        results.append(result)
        print(f"{result.name}: {result.status} {result.reason}".rstrip(), flush=True)
        # Written after each step, so a check stopped from outside keeps what it measured.
        write_results(args.out, results, {"machine": machine(), "ckpt": args.ckpt})
    write_results(args.out, results, {"machine": machine(), "ckpt": args.ckpt})
    print(markdown_table(results))
    print(f"written: {args.out / 'gpu_check.json'}, {args.out / 'gpu_check.md'}")
    return 0 if all(r.status != "failed" for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.exit(main())

"""``areno eval``: parse, plan (every check), evaluate with a progress bar, print a table."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from areno_core.registry import get_registry

console = Console()

EVAL_HELP = """Score checkpoints on a held-out set: greedy accuracy, pass@k, reward, lengths.

\b
Examples:
  areno eval --recipe math/arith --ckpt runs/demo-arith/step_500
  areno eval --recipe math/arith --ckpt runs/demo-arith --n-samples 8 --pass-k 1,4,8
  areno eval --ckpt runs/sft/step_20 --dataset-path test.jsonl \\
    --dataset-loader-fn loader.py --reward-fn-path reward.py

--ckpt takes a step_N directory, a LoRA adapter checkpoint, a run's --save-path (each of its
step_N), a Hugging Face id or random:...; give it several times to compare. A recipe
supplies its evaluation set, loader, reward and lengths (its pack may register an evaluator
for it); flags override them. The table is printed and the report written as JSON (--output).
"""

# The table's columns: metric key -> heading.
COLUMNS = {
    "accuracy": "accuracy",
    "reward_mean": "reward",
    "response_length_mean": "length",
    "truncation_rate": "truncated",
}


def _pass_k(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated integers such as 1,4,8, got {value!r}"
        ) from None


@click.command("eval", help=EVAL_HELP)
@click.option("--ckpt", "ckpts", multiple=True, help="Checkpoint(s) to score (repeatable).")
@click.option("--recipe", default=None, help="Recipe whose evaluation set and scoring to use.")
@click.option("--algo", default=None, help="With --recipe: whose per-algorithm options to use.")
@click.option("--dataset-path", "dataset", default=None, help="Held-out dataset.")
@click.option("--dataset-loader-fn", "loader", default=None, help="Loader: file.py or name.")
@click.option("--reward-fn-path", "reward", default=None, help="Reward: file.py or name.")
@click.option("--limit", type=int, default=None, help="Score only the first N rows.")
@click.option("--max-new-tokens", type=int, default=None, help="Longest completion.")
@click.option("--max-prompt-tokens", type=int, default=None, help="Longer prompts are skipped.")
@click.option(
    "--n-samples", type=int, default=None, help="Sampled completions per prompt for pass@k."
)
@click.option("--pass-k", default=None, help="k values of pass@k (default: 1 and n).")
@click.option("--temperature", type=float, default=None, help="Sampling temperature.")
@click.option("--top-p", type=float, default=None, help="Nucleus sampling threshold.")
@click.option("--top-k", type=int, default=None, help="Top-k sampling (-1: off).")
@click.option("--seed", type=int, default=None, help="Seed of the sampled pass.")
@click.option("--disable-thinking", is_flag=True, default=None, help="Chat template flag.")
@click.option("--rollout-engine", "engine", default=None, help="Registered rollout engine.")
@click.option("--max-running-prompts", type=int, default=None, help="Sequences decoded at once.")
@click.option(
    "--attn-backend", type=click.Choice(["flash", "native"]), default=None, help="As in training."
)
@click.option("--device", default=None, help="cpu, cuda, cuda:1 ... (default: auto).")
@click.option("--dtype", default=None, help="auto, float32, bfloat16 or float16.")
@click.option("--output", default=None, help="JSON report (default: runs/eval-<time>.json).")
def eval_command(
    ckpts: tuple[str, ...], algo: str | None, output: str | None, **given: Any
) -> None:
    from areno_core.checkpoint_eval import plan_eval, run_eval  # the model stack: for a real run

    registry = get_registry()
    given["pass_k"] = _pass_k(given["pass_k"])
    plan = plan_eval(given, ckpts, output, registry, algo=algo)
    s = plan.settings
    console.print(
        f"[bold]areno eval[/]: {len(plan.checkpoints)} checkpoint(s) on {len(plan.rows)} "
        f"prompts of {s.dataset} (reward {s.reward}"
        + (f", {s.n_samples} samples per prompt" if s.n_samples else "")
        + f"), engine {s.engine}",
        highlight=False,
    )
    columns = dict(COLUMNS)
    columns.update({f"pass@{k}": f"pass@{k}" for k in s.pass_k})
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("evaluating", total=len(plan.checkpoints))

        def on_progress(ckpt: Any, phase: str) -> None:
            bar.update(task, description=f"{ckpt.label}: {phase}")

        def on_result(result: dict[str, Any]) -> None:
            bar.advance(task)
            m = result["metrics"]
            parts = [f"{k} {m[k]:.3f}" for k in columns if k in m]
            bar.console.print(f"{result['checkpoint']}: " + ", ".join(parts), highlight=False)

        results = run_eval(plan, registry, on_progress=on_progress, on_result=on_result)
    table = Table(title=f"areno eval ({s.recipe or s.dataset})")
    table.add_column("checkpoint")
    for heading in columns.values():
        table.add_column(heading, justify="right")
    for result in results:
        m = result["metrics"]
        cells = [f"{m[k]:.3f}" if k in m else "-" for k in columns]
        table.add_row(result["checkpoint"], *cells)
    console.print(table)
    console.print(f"report: {plan.output}", highlight=False)

"""``areno train``: resolve options, validate everything cheap, then run the loop."""

from __future__ import annotations

from typing import Any

import click
import yaml
from rich.console import Console

from areno_core.cli.options import RunOptionsCommand, SectionedOption, explicit_options
from areno_core.cli.recipes import dry_run_header, print_recipe_table
from areno_core.registry import get_registry
from areno_core.resolve import ResolvedRun, resolve_run
from areno_core.runner.boot import WorkerProcess

console = Console()

TRAIN_HELP = """Train a model with one of the registered algorithms.

The command owns the whole loop: loading and normalising the dataset, rollout and reward
scoring for online RL, losses, optimizer steps, metrics and checkpoints.

\b
Example (CPU, tiny random model, real GSM8K rows):
  areno train --algo sft --ckpt random:qwen3-tiny \\
    --dataset-path data/gsm8k.jsonl --dataset-loader-fn loader.py

Option precedence, lowest first: defaults, --recipe, --config, flags. Each installed
algorithm, rollout engine and training backend adds a section of its own options below.

\b
Recipes:
  areno train --list-recipes                      # installed public recipes
  areno train --recipe NAME --algo ALGO --dry-run # what a recipe sets, without training
"""


def _option_table() -> Any:
    return get_registry().options


@click.command("train", cls=RunOptionsCommand, help=TRAIN_HELP, table=_option_table)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    cls=SectionedOption,
    section="basic",
    help="YAML file of options (flat, or nested by section). Flags override it.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    cls=SectionedOption,
    section="basic",
    help="Resolve and validate every option, print the result, and exit without training.",
)
@click.option(
    "--list-recipes",
    is_flag=True,
    cls=SectionedOption,
    section="basic",
    help="List the installed public recipes (those supporting --algo, when given) and exit.",
)
@click.option(
    "--include-internal",
    is_flag=True,
    cls=SectionedOption,
    section="basic",
    help="With --list-recipes: also list internal smoke/release recipes (for maintainers).",
)
@click.pass_context
def train(
    ctx: click.Context,
    config_path: str | None,
    dry_run: bool,
    list_recipes: bool,
    include_internal: bool,
    **_: Any,
) -> None:
    registry = get_registry()  # the one registry this command and its run use
    flags = explicit_options(ctx, registry.options)
    if include_internal and not list_recipes:
        raise click.UsageError("--include-internal only applies to --list-recipes")
    if list_recipes:
        print_recipe_table(
            console, registry, include_internal=include_internal, algo=flags.get("algo")
        )
        return
    resolved = resolve_run(
        flags, registry=registry, config_path=config_path, check_capabilities=not dry_run
    )
    if dry_run:
        text = dry_run_header(resolved) + yaml.safe_dump(resolved.to_dict(), sort_keys=False)
        console.print(text, highlight=False, markup=False, soft_wrap=True)
        return
    # The --async-rollout worker starts now: it imports its stack while this process imports
    # and loads its own (the spec follows once the model is loaded; see runner.boot).
    early = _early_rollout_worker(resolved)
    try:
        from areno_core.run import run_training  # torch and the model stack: only for a run

        # The command line as given, for a backend that starts worker processes running it.
        argv = (ctx.find_root().obj or {}).get("argv")
        result = run_training(resolved, registry=registry, argv=argv, rollout_worker=early)
    finally:
        if early is not None:
            early.close()  # a no-op once the run took it over
    if result is not None and result.interrupted:  # None: the workers it launched trained
        raise SystemExit(130)


def _early_rollout_worker(resolved: ResolvedRun) -> WorkerProcess | None:
    cfg = resolved.config
    if not cfg.async_rollout or (cfg.world_size or 1) > 1:
        return None
    return WorkerProcess.spawn()

"""The smoke matrix: train every smoke recipe through ``areno train``, gate it, print a table.

::

    python -m areno_smoke                        # every recipe of the smoke pack
    python -m areno_smoke --only smoke/sft       # some of them
    python -m areno_smoke --keep runs/smoke      # keep run outputs (default: a temp dir)
    python -m areno_smoke --json smoke.json      # also write the results as JSON
    python -m areno_smoke --list                 # what would run, with gates, and exit

Each recipe runs in this process through the real command line (``areno train --recipe NAME
--algo ALGO --save-path DIR``), with its output captured to ``DIR.train.log``; then its gates
are evaluated on the run's ``metrics.jsonl`` and checkpoints by :mod:`areno_core.gates`. A
registered algorithm that no smoke recipe covers is a failed row. The exit status is 0 when
every row passed and 1 otherwise.

This is maintainer tooling, deliberately not an ``areno`` subcommand: see
docs/product/recipe-system.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
from rich.console import Console
from rich.table import Table

from areno_core.gates import GateResult, check_run
from areno_core.recipe import Recipe
from areno_core.registry import Registry, get_registry

SMOKE_PACK = "smoke"
LOG_FILE = "train.log"


@attrs.define
class MatrixRow:
    """One (recipe, algorithm) cell of the matrix and its outcome."""

    recipe: str
    algo: str
    status: str  # "pass", "fail" (a gate failed), "error" (training failed), "missing"
    seconds: float = 0.0
    gates: list[GateResult] = attrs.Factory(list)
    detail: str = ""
    run_dir: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_json(self) -> dict[str, object]:
        return {
            "recipe": self.recipe,
            "algo": self.algo,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "detail": self.detail,
            "run_dir": self.run_dir,
            "gates": [
                {
                    "gate": g.gate.describe(),
                    "kind": g.gate.kind,
                    "passed": g.passed,
                    "observed": g.observed,
                    "reason": g.reason,
                }
                for g in self.gates
            ],
        }


def smoke_recipes(registry: Registry, pack: str = SMOKE_PACK) -> list[Recipe]:
    """The internal recipes of ``pack``, by name."""
    return [r for r in registry.recipes(include_internal=True) if r.internal and r.pack == pack]


def select(recipes: Sequence[Recipe], only: Sequence[str]) -> list[Recipe]:
    if not only:
        return list(recipes)
    known = {r.name: r for r in recipes}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise SystemExit(
            f"unknown smoke recipe(s): {', '.join(unknown)}; known: {', '.join(known) or 'none'}"
        )
    return [known[n] for n in only]


def run_one(recipe: Recipe, algo: str, run_dir: Path) -> MatrixRow:
    """Train ``recipe`` with ``algo`` via ``areno train`` into ``run_dir``, then gate it."""
    from areno_core.cli.main import main as areno_main

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.parent / f"{run_dir.name}.{LOG_FILE}"
    argv = ["train", "--recipe", recipe.name, "--algo", algo, "--save-path", str(run_dir)]
    row = MatrixRow(recipe.name, algo, "error", run_dir=str(run_dir))
    started = time.perf_counter()
    code: int | str | None = 0
    try:
        with (
            open(log_path, "w") as log,
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
        ):
            try:
                areno_main(argv)
            except SystemExit as exc:
                code = exc.code
    except Exception as exc:  # a crash in one recipe must not stop the matrix
        row.seconds = time.perf_counter() - started
        row.detail = f"crashed: {type(exc).__name__}: {exc}; log: {log_path}"
        return row
    row.seconds = time.perf_counter() - started
    if code not in (0, None):
        row.detail = f"areno train exited {code}: {_last_line(log_path)} (log: {log_path})"
        return row
    report = check_run(recipe, run_dir)
    row.seconds = time.perf_counter() - started  # training plus gates
    row.gates = list(report.results)
    row.status = "pass" if report.passed else "fail"
    row.detail = "; ".join(f"{r.gate.describe()}: {r.reason}" for r in report.failures)
    return row


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def run_matrix(
    recipes: Sequence[Recipe],
    out_dir: Path,
    *,
    registry: Registry,
    console: Console | None = None,
    check_coverage: bool = True,
) -> list[MatrixRow]:
    """Run every (recipe, algorithm) pair; add a ``missing`` row per uncovered algorithm."""
    rows: list[MatrixRow] = []
    for recipe in recipes:
        for algo in recipe.algorithms:
            if console is not None:
                console.print(f"running {recipe.name} --algo {algo} ...", highlight=False)
            run_dir = out_dir / f"{recipe.name.replace('/', '-')}-{algo}"
            rows.append(run_one(recipe, algo, run_dir))
            if console is not None:
                last = rows[-1]
                console.print(f"  {last.status} in {last.seconds:.1f} s", highlight=False)
    if check_coverage:
        covered = {a for r in recipes for a in r.algorithms}
        for algo in registry.names("algorithms"):
            if algo not in covered:
                rows.append(
                    MatrixRow("-", algo, "missing", detail="no smoke recipe covers this algorithm")
                )
    return rows


_STYLE = {"pass": "bold green", "fail": "bold red", "error": "bold red", "missing": "bold yellow"}


def render(console: Console, rows: Sequence[MatrixRow], total_s: float) -> None:
    table = Table(title="areno smoke matrix", show_lines=True)
    table.add_column("recipe", no_wrap=True)
    table.add_column("algo", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("gates", justify="right", no_wrap=True)
    table.add_column("details")
    for row in rows:
        gates = f"{sum(g.passed for g in row.gates)}/{len(row.gates)}" if row.gates else "-"
        table.add_row(
            row.recipe,
            row.algo,
            f"[{_STYLE[row.status]}]{row.status.upper()}[/]",
            f"{row.seconds:.1f} s",
            gates,
            row.detail or "",
        )
    console.print(table)
    passed = sum(r.passed for r in rows)
    verdict = "[bold green]all passed[/]" if passed == len(rows) else "[bold red]FAILED[/]"
    console.print(f"{passed}/{len(rows)} passed in {total_s:.1f} s: {verdict}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areno_smoke",
        description="Run the internal smoke recipes through areno train and check their gates.",
    )
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME", help="recipes to run")
    parser.add_argument("--pack", default=SMOKE_PACK, help="pack of internal recipes to run")
    parser.add_argument("--keep", metavar="DIR", help="write run outputs here and keep them")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--list", action="store_true", help="list the recipes and their gates")
    parser.add_argument(
        "--no-coverage",
        action="store_true",
        help="do not fail on registered algorithms that no smoke recipe covers",
    )
    args = parser.parse_args(argv)
    console = Console()
    registry = get_registry()
    recipes = select(smoke_recipes(registry, args.pack), args.only)
    if args.list:
        for recipe in recipes:
            console.print(f"[bold]{recipe.name}[/] ({', '.join(recipe.algorithms)})")
            from areno_core.gates import recipe_gates

            for gate in recipe_gates(recipe):
                console.print(f"  - {gate.describe()}", highlight=False)
        return 0
    if not recipes:
        console.print(f"[bold red]no internal recipes in pack {args.pack!r} are installed[/]")
        return 1
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.keep:
            out_dir = Path(args.keep)
            out_dir.mkdir(parents=True, exist_ok=True)
        else:
            out_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="areno-smoke-")))
        rows = run_matrix(
            recipes,
            out_dir,
            registry=registry,
            console=console,
            check_coverage=not args.no_coverage and not args.only,
        )
        if not args.keep:
            for row in rows:
                if not row.passed and row.run_dir:
                    _show_log(console, Path(row.run_dir))
    total = time.perf_counter() - started
    render(console, rows, total)
    if args.json:
        payload: dict[str, object] = {
            "passed": all(r.passed for r in rows),
            "seconds": round(total, 2),
            "rows": [r.to_json() for r in rows],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if rows and all(r.passed for r in rows) else 1


def _show_log(console: Console, run_dir: Path, lines: int = 30) -> None:
    """Print the tail of a failed run's log before its temporary directory goes away."""
    log_path = run_dir.parent / f"{run_dir.name}.{LOG_FILE}"
    if not log_path.is_file():
        return
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    console.print(f"[bold]last lines of {run_dir.name}:[/]")
    console.print("\n".join(tail), highlight=False, markup=False)


if __name__ == "__main__":
    sys.exit(main())

"""``areno plugins``: which plugin distributions are installed and what each registered."""

from __future__ import annotations

import json

import attrs
import click
from rich.console import Console
from rich.table import Table

from areno_core.options import OWNER_KINDS
from areno_core.registry import KINDS, Registry, get_registry

console = Console()


def plugins_report() -> dict[str, object]:
    """Machine-readable description of installed plugins, failures included."""
    registry = get_registry()
    plugins = []
    internal = {r.name for r in registry.recipes(include_internal=True) if r.internal}
    for info in registry.plugins():
        registered = registry.provided_by(info.name)
        hidden = [n for n in registered.get("recipes", []) if n in internal]
        if hidden:  # internal (smoke/release) recipes are not advertised
            registered["recipes"] = [n for n in registered["recipes"] if n not in internal]
            if not registered["recipes"]:
                del registered["recipes"]
        plugins.append(
            {
                "name": info.name,
                "distribution": info.distribution,
                "version": info.version,
                "registered": registered,
                "options": _declared_options(registry, info.name),
                "internal_recipes": len(hidden),
            }
        )
    failures = [
        {"name": f.name, "distribution": f.distribution, "version": f.version, "error": f.error}
        for f in registry.failures
    ]
    return {"plugins": plugins, "failures": failures}


def _declared_options(registry: Registry, plugin_name: str) -> dict[str, list[str]]:
    """The run options each algorithm, engine and backend of one plugin declares."""
    out: dict[str, list[str]] = {}
    for kind, registry_kind, _ in OWNER_KINDS:
        for name, entry in registry.entries[registry_kind].items():
            fields = attrs.fields(entry.obj.config_cls)
            if entry.plugin.name == plugin_name and fields:
                out[f"{kind} {name}"] = [f.name for f in fields]
    return out


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json: bool) -> None:
    """List installed plugins, their versions, and what each registered."""
    report = plugins_report()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    table = Table(title="areno plugins", show_lines=True)
    table.add_column("distribution")
    table.add_column("version")
    table.add_column("plugin")
    table.add_column("registered")
    for p in report["plugins"]:  # type: ignore[union-attr]
        registered = p["registered"] or {}
        lines = [f"{KINDS[k][1]}s: {', '.join(v)}" for k, v in registered.items()]
        for owner, names in p["options"].items():
            flags = ", ".join("--" + n.replace("_", "-") for n in names)
            lines.append(f"options of {owner}: {flags}")
        table.add_row(p["distribution"], p["version"], p["name"], "\n".join(lines) or "(nothing)")
    console.print(table)
    if not get_registry().names("algorithms"):
        console.print(
            "No algorithms are registered, so nothing can be trained yet.\n"
            "Install some, e.g.: pip install areno-algos areno-recipes-math"
        )
    for f in report["failures"]:  # type: ignore[union-attr]
        console.print(
            f"[bold red]failed:[/] plugin {f['name']!r} from {f['distribution']} "
            f"{f['version']}: {f['error']}",
            highlight=False,
        )

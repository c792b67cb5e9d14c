"""The registry: every algorithm, loader, reward, agent, recipe, rollout engine and training
backend, by name.

Built from a plugin manager by calling each plugin's hooks with a ``register`` callback. What a
plugin registers is validated; a name registered twice is recorded as a failure of the later
plugin, naming both distributions, and the rest of the registry works.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import attrs

from areno_core.algorithm import AlgorithmSpec
from areno_core.config import OPTION_SECTIONS, build_config, core_sections
from areno_core.contracts.backend import BackendSpec
from areno_core.contracts.engine import EngineSpec
from areno_core.contracts.sink import SinkSpec
from areno_core.errors import ConfigError, PluginError, did_you_mean
from areno_core.evaluators import EvaluatorSpec
from areno_core.log import get_logger
from areno_core.options import (
    OWNER_KINDS,
    OptionClash,
    OptionTable,
    Owner,
    Section,
    check_config_class,
    normalize_key,
)
from areno_core.plugins import ArenoPluginManager, PluginFailure, PluginInfo, get_plugin_manager
from areno_core.recipe import Recipe
from areno_core.validators import flag

logger = get_logger(__name__)
T = TypeVar("T")

# kind -> (hook name, human noun)
KINDS: dict[str, tuple[str, str]] = {
    "algorithms": ("register_algorithms", "algorithm"),
    "dataset_loaders": ("register_dataset_loaders", "dataset loader"),
    "rewards": ("register_rewards", "reward"),
    "agents": ("register_agents", "agent"),
    "recipes": ("register_recipes", "recipe"),
    "rollout_engines": ("register_rollout_engines", "rollout engine"),
    "backends": ("register_backends", "training backend"),
    "metric_sinks": ("register_metric_sinks", "metric sink"),
    "evaluators": ("register_evaluators", "evaluator"),
}
# Kinds registered as spec objects (name, summary, config_cls, ...), by their spec class.
_SPEC_KINDS: dict[str, type] = {
    "algorithms": AlgorithmSpec,
    "recipes": Recipe,
    "rollout_engines": EngineSpec,
    "backends": BackendSpec,
    "metric_sinks": SinkSpec,
    "evaluators": EvaluatorSpec,
}


@attrs.frozen
class Entry(Generic[T]):
    name: str
    obj: T
    plugin: PluginInfo


class Registry:
    """Everything the installed plugins registered, looked up by kind and name."""

    def __init__(self, pm: ArenoPluginManager) -> None:
        self.pm = pm
        self.entries: dict[str, dict[str, Entry[Any]]] = {kind: {} for kind in KINDS}
        self.failures: list[PluginFailure] = list(pm.failures)
        for kind, (hook_name, noun) in KINDS.items():
            hook = getattr(pm.hook, hook_name)
            for impl in hook.get_hookimpls():  # in registration order
                # Call each plugin's hook through pluggy (so ARENO_TRACE_PLUGINS sees it), one
                # plugin at a time, so every registration is attributed to its plugin.
                others = [p for p in pm.get_plugins() if p is not impl.plugin]
                caller = pm.subset_hook_caller(hook_name, remove_plugins=others)
                self._collect(kind, noun, impl.plugin_name, caller)
        self._check_recipes()

    # -- building -------------------------------------------------------------------------

    def _check_recipes(self) -> None:
        """Drop (and report as a failure of its plugin) a recipe whose options do not fit the
        installed option table (built first, which disables a plugin whose options clash)."""
        self.options  # noqa: B018 - build the table here: a clashing plugin is disabled first
        recipes = self.entries["recipes"]
        for name, entry in list(recipes.items()):
            try:
                self._check_recipe(entry.obj)
            except ValueError as exc:
                del recipes[name]
                info = entry.plugin
                error = f"recipe {name!r} is not usable: {exc}"
                logger.error("plugin %s: %s", info.label, error)
                self.failures.append(
                    PluginFailure(info.name, info.distribution, info.version, error)
                )

    def _check_recipe(self, recipe: Recipe) -> None:
        """Check every option a recipe sets against the installed option table: the name is
        declared (by the core or a plugin), and with each of the recipe's installed algorithms the
        values build the algorithm's and the engine's config. Raises ``ValueError``."""
        table = self.options
        where = f"recipe {recipe.name!r}"
        installed = [a for a in recipe.algorithms if a in self.entries["algorithms"]]
        # An option no installed plugin declares may belong to one of the recipe's algorithms that
        # is not installed; it is an error only when every algorithm of the recipe is installed.
        if len(installed) == len(recipe.algorithms):
            for source, options in recipe._layers():
                for key in options:
                    try:
                        table.check_name(str(key))
                    except ConfigError as exc:
                        raise ValueError(f"{where}: {source} sets {exc}") from exc
        for algo, lora in [(a, lora) for a in installed for lora in (False, True)]:
            if lora and not recipe.lora_defaults:
                continue
            raw = {k: v for k, v in recipe._raw_options(algo, lora=lora).items() if k in table}
            own = recipe.algorithm_defaults.get(algo, {})
            try:
                cfg = build_config(raw, table=table)
                spec = self.algorithm(algo)
                spec.make_config(cfg.plugin)
                declared = {f.name for f in attrs.fields(spec.config_cls)}
                for key in own:
                    name = normalize_key(str(key))
                    if name not in OPTION_SECTIONS and name not in declared:
                        owners = ", ".join(o.label for o in table.owners(name))
                        raise ConfigError(
                            f"algorithm_defaults[{algo!r}] sets {flag(name)}, which --algo "
                            f"{algo} does not read (it belongs to {owners})"
                        )
                engine = cfg.rollout_engine
                if engine in self.entries["rollout_engines"]:
                    self.engine(engine).make_config(cfg.plugin)
            except ConfigError as exc:
                raise ValueError(f"{where} with --algo {algo}: {exc}") from exc

    def _collect(self, kind: str, noun: str, plugin_name: str, fn: Callable[..., Any]) -> None:
        info = self.pm.info_for(plugin_name)
        staged: list[Entry[Any]] = []

        def register(*args: Any) -> None:
            staged.append(self._make_entry(kind, noun, info, args))

        try:
            fn(register=register)
        except Exception as exc:
            # Something the plugin registered is invalid (PluginError) or its hook raised:
            # either way that plugin fails like any broken plugin and every other one works.
            detail = "".join(traceback.format_exception(exc))
            error = f"{KINDS[kind][0]} failed: {type(exc).__name__}: {exc}"
            if isinstance(exc, PluginError):
                error, detail = f"{KINDS[kind][0]}: {exc}", ""
            logger.error("plugin %s: %s", info.label, error)
            self.failures.append(
                PluginFailure(info.name, info.distribution, info.version, error, detail)
            )
            return
        table = self.entries[kind]
        seen: dict[str, PluginInfo] = {}
        for entry in staged:
            first = table[entry.name].plugin if entry.name in table else seen.get(entry.name)
            if first is not None:
                # A clash is the later plugin's fault: it is recorded as failed like any other
                # broken plugin and none of this hook's registrations are kept; the rest works.
                error = (
                    f"{noun} {entry.name!r} is registered twice: by {first.label} and by "
                    f"{entry.plugin.label}; the later plugin's {noun}s are not loaded. Uninstall "
                    "one, or disable one with ARENO_DISABLE_PLUGINS."
                )
                logger.error("plugin %s: %s", info.label, error)
                self.failures.append(
                    PluginFailure(info.name, info.distribution, info.version, error)
                )
                return
            seen[entry.name] = entry.plugin
        for entry in staged:
            table[entry.name] = entry

    @staticmethod
    def _make_entry(kind: str, noun: str, info: PluginInfo, args: tuple[Any, ...]) -> Entry[Any]:
        where = f"plugin {info.label}"
        spec_cls = _SPEC_KINDS.get(kind)
        if spec_cls is not None:
            if len(args) != 1 or not isinstance(args[0], spec_cls):
                raise PluginError(
                    f"{where}: register() for {noun}s takes one {spec_cls.__name__}, got "
                    f"{', '.join(type(a).__name__ for a in args) or 'nothing'}"
                )
            spec = args[0]
            if hasattr(spec, "config_cls"):
                check_config_class(spec.config_cls, f"{where}: {noun} {spec.name!r}")
            return Entry(spec.name, spec, info)
        if len(args) != 2 or not isinstance(args[0], str) or not callable(args[1]):
            raise PluginError(f"{where}: register() for {noun}s takes (name: str, function)")
        name = args[0]
        if not name.strip() or name != name.strip():
            raise PluginError(f"{where}: {noun} name {name!r} is empty or has spaces around it")
        return Entry(name, args[1], info)

    # -- lookups --------------------------------------------------------------------------

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def get(self, kind: str, name: str) -> Any:
        table = self.entries[kind]
        if name in table:
            return table[name].obj
        noun = KINDS[kind][1]
        known = sorted(table)
        hint = did_you_mean(name, known, cutoff=0.5)
        if known:
            listing = f"Registered {noun}s: {', '.join(known)}."
        else:
            listing = f"No {noun}s are registered. {_install_hint(kind)}"
        raise ConfigError(f"unknown {noun} {name!r}.{hint} {listing}")

    def algorithm(self, name: str) -> AlgorithmSpec:
        return self.get("algorithms", name)

    def engine(self, name: str) -> EngineSpec:
        return self.get("rollout_engines", name)

    def backend(self, name: str) -> BackendSpec:
        return self.get("backends", name)

    def sink(self, name: str) -> SinkSpec:
        return self.get("metric_sinks", name)

    def evaluator(self, name: str) -> EvaluatorSpec | None:
        """The evaluator registered for recipe ``name``, or None."""
        entry = self.entries["evaluators"].get(name)
        return entry.obj if entry is not None else None

    @functools.cached_property
    def options(self) -> OptionTable:
        """Every run option: the core's and each registered algorithm's, engine's and
        backend's. A plugin that declares an option the core or an earlier plugin declares
        otherwise is disabled (reported as a failure naming both, like any broken plugin):
        the rest of the registry and every command keep working."""
        while True:
            try:
                return OptionTable(self._option_sections())
            except OptionClash as clash:
                self._disable(clash.loser, str(clash))

    def _option_sections(self) -> list[Section]:
        """The core's sections, each followed by the sections of the plugins that belong
        under it (an engine's options after ``rollout``, a backend's and an algorithm's
        after ``train``), in registration order."""
        extra: dict[str, list[Section]] = {}
        for kind, registry_kind, after in OWNER_KINDS:
            for name, entry in self.entries[registry_kind].items():
                owner = Owner(kind, name, entry.plugin.distribution, entry.obj.summary)
                extra.setdefault(after, []).append(
                    Section(
                        key=f"{registry_kind}:{name}",
                        title=f"{kind.capitalize()} {name} ({entry.plugin.distribution})",
                        doc=entry.obj.summary,
                        fields=tuple(attrs.fields(entry.obj.config_cls)),
                        owner=owner,
                    )
                )
        sections: list[Section] = []
        for section in core_sections():
            sections.append(section)
            sections.extend(extra.get(section.key, []))
        return sections

    def _disable(self, owner: Owner, error: str) -> None:
        """Drop everything the plugin behind ``owner`` registered and record why."""
        registry_kind = next(k for kind, k, _ in OWNER_KINDS if kind == owner.kind)
        info = self.entries[registry_kind][owner.name].plugin
        for table in self.entries.values():
            for name in [n for n, e in table.items() if e.plugin.name == info.name]:
                del table[name]
        logger.error("plugin %s: %s", info.label, error)
        self.failures.append(
            PluginFailure(
                info.name, info.distribution, info.version, f"{error} The plugin is disabled."
            )
        )

    def recipe(self, name: str) -> Recipe:
        return self.get("recipes", name)

    def recipes(self, *, include_internal: bool = False) -> list[Recipe]:
        found = [e.obj for e in self.entries["recipes"].values()]
        if not include_internal:
            found = [r for r in found if r.visibility == "public"]
        return sorted(found, key=lambda r: r.name)

    def provided_by(self, plugin_name: str) -> dict[str, list[str]]:
        """What one plugin registered, by kind."""
        out: dict[str, list[str]] = {}
        for kind, table in self.entries.items():
            names = sorted(n for n, e in table.items() if e.plugin.name == plugin_name)
            if names:
                out[kind] = names
        return out

    def plugins(self) -> Iterable[PluginInfo]:
        return sorted(self.pm.infos.values(), key=lambda p: p.distribution)


def _install_hint(kind: str) -> str:
    if kind == "algorithms":
        return "Install them with: pip install areno-algos"
    if kind == "recipes":
        return "Install a recipe pack, e.g.: pip install areno-recipes-math"
    return "Install a plugin package that provides some."


_REGISTRY: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry of installed plugins, built on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry(get_plugin_manager())
    return _REGISTRY


def set_registry(registry: Registry | None) -> None:
    """Replace (or with ``None``, forget) the process-wide registry; used by tests and tools."""
    global _REGISTRY
    _REGISTRY = registry

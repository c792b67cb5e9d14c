"""Building the plugin manager: entry points of group ``areno``, allow/block lists, tracing.

Environment variables:

``ARENO_PLUGINS``
    Comma-separated allow-list. When set, only these plugins load (match on the entry-point
    name or the distribution name). Set it to an empty string to load no plugin at all.
``ARENO_DISABLE_PLUGINS``
    Comma-separated block-list, matched the same way.
``ARENO_TRACE_PLUGINS``
    When ``1``, every hook call is logged at DEBUG level on the ``areno.plugins`` logger.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import attrs
import pluggy

from areno_core import hookspecs
from areno_core.errors import PluginError, did_you_mean
from areno_core.log import get_logger

ENTRY_POINT_GROUP = "areno"
ENV_ALLOW = "ARENO_PLUGINS"
ENV_BLOCK = "ARENO_DISABLE_PLUGINS"
ENV_TRACE = "ARENO_TRACE_PLUGINS"

logger = get_logger(__name__)


@attrs.frozen
class PluginInfo:
    """Where a registered plugin came from."""

    name: str
    distribution: str
    version: str

    @property
    def label(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"{self.distribution}{version} (plugin {self.name!r})"


@attrs.frozen
class PluginFailure:
    """A plugin that was found but could not be used."""

    name: str
    distribution: str
    version: str
    error: str
    detail: str = ""


class ArenoPluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers each plugin's distribution and the plugins that failed."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.failures: list[PluginFailure] = []

    def register_plugin(
        self, plugin: Any, name: str, distribution: str = "<local>", version: str = ""
    ) -> bool:
        """Register ``plugin`` and check its hook names; a bad plugin is recorded, not raised."""
        try:
            self.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            self._fail(name, distribution, version, f"cannot register: {exc}")
            return False
        unknown = _unknown_hooks(self, plugin)
        if unknown:
            self.unregister(plugin)
            self._fail(name, distribution, version, unknown)
            return False
        self.infos[name] = PluginInfo(name, distribution, version)
        return True

    def info_for(self, plugin_name: str) -> PluginInfo:
        return self.infos.get(plugin_name, PluginInfo(plugin_name, "<local>", ""))

    def _fail(self, name: str, dist: str, version: str, error: str, detail: str = "") -> None:
        logger.error("plugin %r from %s could not be loaded: %s", name, dist, error)
        self.failures.append(PluginFailure(name, dist, version, error, detail))


def _unknown_hooks(pm: pluggy.PluginManager, plugin: Any) -> str:
    """Describe hook implementations of ``plugin`` that match no hook spec (a misspelling)."""
    known = sorted(
        name
        for name in dir(pm.hook)
        if not name.startswith("_") and getattr(pm.hook, name).spec is not None
    )
    problems = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.spec is None:
            hint = did_you_mean(caller.name, known, n=1)
            problems.append(f"unknown hook {caller.name!r}.{hint}".rstrip("."))
    return "; ".join(problems)


def _parse_list(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {part.strip() for part in value.split(",") if part.strip()}


def _selected(ep_name: str, dist_name: str, allow: set[str] | None, block: set[str]) -> bool:
    names = {ep_name, dist_name, dist_name.replace("-", "_")}
    if allow is not None and not names & allow:
        return False
    return not names & block


def load_entry_point_plugins(
    pm: ArenoPluginManager, found: Iterable[metadata.EntryPoint] | None = None
) -> None:
    """Import every ``areno`` entry point, honouring the allow and block lists."""
    allow = _parse_list(os.environ.get(ENV_ALLOW))
    block = _parse_list(os.environ.get(ENV_BLOCK)) or set()
    seen: set[tuple[str, str]] = set()
    # By distribution name, so which of two clashing plugins loads later (and is the one that
    # fails, see Registry) does not depend on the order of folders on disk.
    found = sorted(
        metadata.entry_points(group=ENTRY_POINT_GROUP) if found is None else found,
        key=lambda ep: (ep.dist.name if ep.dist is not None else "", ep.name),
    )
    for ep in found:
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        version = ep.dist.version if ep.dist is not None else ""
        if _is_core(ep):  # registered first, by get_plugin_manager
            continue
        if (dist, ep.name) in seen:  # the same distribution visible twice on sys.path
            continue
        seen.add((dist, ep.name))
        if not _selected(ep.name, dist, allow, block):
            logger.debug(
                "plugin %r from %s is disabled by %s/%s", ep.name, dist, ENV_ALLOW, ENV_BLOCK
            )
            continue
        if pm.has_plugin(ep.name):
            other = pm.info_for(ep.name)
            pm._fail(
                ep.name,
                dist,
                version,
                f"plugin name {ep.name!r} is already used by {other.label}; "
                f"rename one entry point or disable one with {ENV_BLOCK}",
            )
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken plugin must not break the CLI
            detail = "".join(traceback.format_exception(exc))
            pm._fail(ep.name, dist, version, f"import failed: {type(exc).__name__}: {exc}", detail)
            continue
        pm.register_plugin(plugin, ep.name, dist, version)


def get_plugin_manager(*, load_entry_points: bool = True) -> ArenoPluginManager:
    """Create a plugin manager with the hook specs and (by default) every installed plugin."""
    pm = ArenoPluginManager()
    if os.environ.get(ENV_TRACE) == "1":
        pm.trace.root.setwriter(lambda msg: logger.debug("%s", msg.rstrip()))
        pm.enable_tracing()
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    _register_core(pm, found)
    if load_entry_points:
        load_entry_point_plugins(pm, found)
    return pm


CORE_PLUGIN = "core"
CORE_DISTRIBUTION = "areno-core"


def _is_core(ep: metadata.EntryPoint) -> bool:
    return ep.name == CORE_PLUGIN and ep.dist is not None and ep.dist.name == CORE_DISTRIBUTION


def _register_core(pm: ArenoPluginManager, found: Iterable[metadata.EntryPoint]) -> None:
    """areno-core's own plugin (:mod:`areno_core.builtins`: the native engine, the local and
    distributed backends, the built-in metric sinks). It stands above the rest of the core,
    so it is found like any plugin, through its entry point, rather than imported from here."""
    core = [ep for ep in found if _is_core(ep)]
    if not core:
        raise PluginError(
            f"areno-core's own entry point {CORE_PLUGIN!r} (group {ENTRY_POINT_GROUP!r}) is "
            "missing: its install metadata is out of date; reinstall areno-core "
            "(pip install -e . in a checkout)"
        )
    ep = core[0]
    pm.register_plugin(ep.load(), CORE_PLUGIN, CORE_DISTRIBUTION, ep.dist.version)

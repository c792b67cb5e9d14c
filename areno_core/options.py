"""Run options: how they are declared, and the table of every option a run can take.

An option is an attrs field whose metadata holds its help text, declared with :func:`option`.
The core declares its own options in :mod:`areno_core.config`; an algorithm, a rollout engine
or a training backend declares its own in the ``config_cls`` of its spec, and nowhere else::

    @attrs.frozen
    class MyAlgoConfig:
        my_beta: float = option(0.1, "Temperature of my loss.", validator=number(min=0.0))

:class:`OptionTable` collects the core's sections and every installed plugin's config classes.
``areno train --help``, ``--config`` YAML, recipes and the generated reference (docs/cli.md)
are all built from it, so a plugin's options become flags without any change to the core.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs
import cattrs

from areno_core.errors import ConfigError, PluginError
from areno_core.validators import Validator, flag, one_of


def option(
    default: Any,
    help: str,
    *,
    validator: Validator | list[Validator] | None = None,
    choices: tuple[str, ...] | None = None,
    negatable: bool = False,
    metavar: str | None = None,
    default_text: str | None = None,
    resume_may_change: bool = False,
) -> Any:
    """Declare one run option as an attrs field. ``help`` is its only documentation.

    ``choices`` restricts a text option (checked, and listed in ``--help``); ``negatable``
    gives a bool option a ``--no-...`` form (use it for options that default to true);
    ``default_text`` replaces the default in help when the real default is computed;
    ``resume_may_change`` lets a resumed run give it another value than the saved run had
    (for options that change how the run goes, not what it trains: a server address, a
    timeout).
    """
    validators = list(validator) if isinstance(validator, list) else [validator]
    validators = [v for v in validators if v is not None]
    if choices is not None:
        validators.append(one_of(choices))
    return attrs.field(
        default=default,
        validator=validators or None,
        metadata={
            "help": help,
            "choices": choices,
            "negatable": negatable,
            "metavar": metavar,
            "default_text": default_text,
            "resume_may_change": resume_may_change,
        },
    )


# -- types ------------------------------------------------------------------------------------

_TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}


def base_type(field: attrs.Attribute[Any]) -> type:
    """The value type of an option field (``int | None`` -> ``int``)."""
    text = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    text = str(text or field.type)
    for name, typ in _TYPES.items():
        if text.startswith(name):
            return typ
    raise TypeError(
        f"option {field.name!r} has type {field.type!r}; options are bool, int, float or str "
        "(optionally '| None')"
    )


def allows_none(field: attrs.Attribute[Any]) -> bool:
    return "None" in str(field.type)


_converter = cattrs.Converter(forbid_extra_keys=True)


def coerce_value(field: attrs.Attribute[Any], value: Any) -> Any:
    """Convert a YAML/CLI value to the option's declared type; errors name the option."""
    if value is None:
        if not allows_none(field):
            raise ConfigError(f"{flag(field.name)} cannot be empty (null)")
        return None
    target = base_type(field)
    try:
        if target is bool and not isinstance(value, bool):
            raise TypeError
        if target is int and isinstance(value, float) and not value.is_integer():
            raise TypeError
        if target in (int, float) and isinstance(value, bool):
            raise TypeError
        return _converter.structure(value, target)
    except Exception as exc:
        raise ConfigError(f"{flag(field.name)} expects {target.__name__}, got {value!r}") from exc


def normalize_key(key: str) -> str:
    """``--mini-bs``, ``mini-bs`` and ``mini_bs`` all name the option ``mini_bs``."""
    return key.strip().lstrip("-").replace("-", "_")


def make_options(cls: type, values: Any) -> Any:
    """An instance of the options class ``cls`` from a mapping or an object of run options:
    each field the class declares is read when present (others keep their defaults)."""
    picked: dict[str, Any] = {}
    for field in attrs.fields(cls):
        if isinstance(values, Mapping):
            if field.name in values:
                picked[field.name] = values[field.name]
        elif hasattr(values, field.name):
            picked[field.name] = getattr(values, field.name)
    return cls(**picked)


def check_spec_callables(what: str, name: str, factory: Any, **optional: Any) -> None:
    """The checks a plugin spec makes of itself: ``name`` is one word without '/', ``factory``
    is callable, and each ``optional`` hook is callable or None (``what``: "backend", ...)."""
    if not name or name != name.strip() or "/" in name:
        raise ValueError(f"{what} name {name!r} must be a non-empty word")
    if not callable(factory):
        raise TypeError(f"{what} {name!r}: factory must be callable")
    for hook, value in optional.items():
        if value is not None and not callable(value):
            raise TypeError(f"{what} {name!r}: {hook} must be callable or None")


def check_config_class(cls: type, where: str) -> None:
    """Raise :class:`PluginError` unless ``cls`` is a valid options class for ``where``."""
    if not attrs.has(cls):
        raise PluginError(f"{where}: config_cls must be an attrs class, got {cls!r}")
    for field in attrs.fields(cls):
        what = f"{where}: option {field.name!r}"
        if field.default is attrs.NOTHING:
            raise PluginError(f"{what} needs a default value")
        if not str(field.metadata.get("help", "")).strip():
            raise PluginError(f"{what} has no help text (declare it with areno_core.option())")
        try:
            base_type(field)
        except TypeError as exc:
            raise PluginError(f"{where}: {exc}") from exc


# -- the table --------------------------------------------------------------------------------


@attrs.frozen
class Owner:
    """An algorithm, rollout engine or training backend that declares options."""

    kind: str  # "algorithm" | "rollout engine" | "training backend"
    name: str
    distribution: str
    summary: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name} ({self.distribution})"


@attrs.frozen
class Section:
    """A group of options as ``--help`` and docs/cli.md show it."""

    key: str
    title: str
    doc: str
    fields: tuple[attrs.Attribute[Any], ...]
    owner: Owner | None = None


@attrs.frozen
class Declared:
    """One option name: its field (the first declaration) and who declares it."""

    field: attrs.Attribute[Any]
    section: str
    owners: tuple[Owner, ...] = ()

    @property
    def core(self) -> bool:
        return not self.owners


# Owner kinds, the registry kind that holds their specs, and the core section they follow.
OWNER_KINDS: tuple[tuple[str, str, str], ...] = (
    ("rollout engine", "rollout_engines", "rollout"),
    ("training backend", "backends", "train"),
    ("algorithm", "algorithms", "train"),
)


# Names people reach for that areno spells otherwise (the Python API's keywords, other tools'
# flags); an unknown option with one of these names is pointed at the real one.
OPTION_ALIASES: dict[str, str] = {
    "learning_rate": "lr",
    "adam_betas": "adam_beta1",
    "algorithm": "algo",
    "model": "ckpt",
    "model_path": "ckpt",
    "model_name_or_path": "ckpt",
    "dataset": "dataset_path",
    "train_file": "dataset_path",
    "output_dir": "save_path",
    "num_epochs": "epochs",
    "num_train_epochs": "epochs",
    "num_generations": "n_samples",
    "num_samples": "n_samples",
    "per_device_train_batch_size": "mini_bs",
    "micro_batch_size": "mini_bs",
    "max_completion_length": "max_new_tokens",
    "max_prompt_length": "max_prompt_tokens",
    "max_grad_norm": "grad_clip_norm",
    "beta": "dpo_beta",
    "logging_dir": "metrics_log_dir",
}


class OptionClash(PluginError):
    """A plugin declares an option that areno-core or an earlier plugin declares otherwise.
    ``loser`` is the plugin whose declaration was refused; ``first`` the one that keeps the
    option (None: the core)."""

    def __init__(self, loser: Owner, first: Owner | None, message: str) -> None:
        super().__init__(message)
        self.loser = loser
        self.first = first


class OptionTable:
    """Every option a run can take: the core's, and those of each installed plugin."""

    def __init__(self, sections: Iterable[Section]) -> None:
        self.sections: list[Section] = list(sections)
        self.declared: dict[str, Declared] = {}
        for section in self.sections:
            for field in section.fields:
                self._add(section, field)

    def _add(self, section: Section, field: attrs.Attribute[Any]) -> None:
        name = field.name
        earlier = self.declared.get(name)
        if earlier is None:
            owners = () if section.owner is None else (section.owner,)
            self.declared[name] = Declared(field, section.key, owners)
            return
        owner = section.owner
        assert owner is not None, f"core option {name!r} declared twice"
        if earlier.core:
            raise OptionClash(
                owner,
                None,
                f"{owner.label} declares the option {flag(name)}, which areno-core already "
                "declares; the plugin must rename its option",
            )
        if _shape(earlier.field) != _shape(field):
            first = earlier.owners[0]
            raise OptionClash(
                owner,
                first,
                f"option {flag(name)} is declared differently by {first.label} "
                f"({_describe(earlier.field)}) and by {owner.label} ({_describe(field)}); "
                "two plugins may share an option only with the same type, default and "
                "choices. Uninstall one, or disable one with ARENO_DISABLE_PLUGINS.",
            )
        self.declared[name] = attrs.evolve(earlier, owners=(*earlier.owners, owner))

    # -- building -----------------------------------------------------------------------------

    # -- lookups ------------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self.declared

    def names(self) -> list[str]:
        return list(self.declared)

    def field(self, name: str) -> attrs.Attribute[Any]:
        return self.declared[name].field

    def owners(self, name: str) -> tuple[Owner, ...]:
        return self.declared[name].owners

    def is_core(self, name: str) -> bool:
        return self.declared[name].core

    def default(self, name: str) -> Any:
        return self.declared[name].field.default

    def plugin_options(self) -> Iterator[tuple[str, attrs.Attribute[Any]]]:
        for name, declared in self.declared.items():
            if not declared.core:
                yield name, declared.field

    def section(self, key: str) -> Section:
        for section in self.sections:
            if section.key == key:
                return section
        raise KeyError(key)

    def check_name(self, key: str, *, where: str = "") -> str:
        """The option name ``key`` normalizes to; an unknown one is a :class:`ConfigError`."""
        name = normalize_key(key)
        if name not in self.declared:
            prefix = f"{where}: " if where else ""
            close = self.suggest(key)
            hint = f" Did you mean {', '.join(flag(n)[2:] for n in close)}?" if close else ""
            raise ConfigError(f"{prefix}unknown option {key!r}.{hint}")
        return name

    def suggest(self, key: str, extra: Iterable[str] = ()) -> list[str]:
        """The option names an unknown ``key`` most likely meant, best first: the option that
        :data:`OPTION_ALIASES` maps it to (``learning_rate`` -> ``lr``),
        else the closest names by spelling. ``extra`` names more candidates (a command's own
        options). One source for the ``--config`` file and the command line alike."""
        name = normalize_key(key)
        candidates = [*self.names(), *(normalize_key(e) for e in extra)]
        if name in candidates:  # a known option written another way (--mini_bs)
            return [name]
        alias = OPTION_ALIASES.get(name.lower())
        if alias in candidates:
            return [alias]
        return difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)

    def coerce(self, name: str, value: Any) -> Any:
        return coerce_value(self.declared[name].field, value)


def _shape(field: attrs.Attribute[Any]) -> tuple[Any, ...]:
    meta = field.metadata
    return (base_type(field), allows_none(field), field.default, meta.get("choices"))


def _describe(field: attrs.Attribute[Any]) -> str:
    typ = base_type(field).__name__ + (" | None" if allows_none(field) else "")
    text = f"{typ}, default {field.default!r}"
    choices = field.metadata.get("choices")
    return text + (f", choices {', '.join(choices)}" if choices else "")


@attrs.frozen
class NoOptions:
    """The config class of a plugin that declares no options."""


__all__ = [
    "OPTION_ALIASES",
    "Declared",
    "NoOptions",
    "OptionClash",
    "OptionTable",
    "Owner",
    "Section",
    "base_type",
    "check_config_class",
    "check_spec_callables",
    "coerce_value",
    "make_options",
    "normalize_key",
    "option",
]

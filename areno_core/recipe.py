"""Recipes: named bundles of defaults and metadata for ``areno train --recipe``.

A recipe never runs code of its own. It names a dataset, a loader, a reward, an agent and a
checkpoint (by registry name, by Hugging Face reference, or by a file shipped inside its
package as ``resource:package/path``), fills option defaults for each algorithm it supports,
and states what a good run looks like (expected metrics and validation gates) and what hardware
it needs. A pack registers recipes through the ``register_recipes`` hook::

    from areno_core import hookimpl
    from areno_core.recipe import Gate, HardwareFloor, Recipe

    COUNTDOWN = Recipe(
        name="puzzles/countdown",
        summary="Countdown number puzzles with an exact-match reward",
        algorithms=("grpo", "gspo"),
        dataset="resource:my_pack/data/countdown.jsonl",
        loader="countdown",                       # a registered loader name
        reward="resource:my_pack/reward.py:score",  # or a file inside the package
        checkpoint="Qwen/Qwen3-0.6B",
        defaults={"lr": 1e-6, "n_samples": 8},
        algorithm_defaults={"gspo": {"gspo_clip_eps": 3e-4}},
        hardware=HardwareFloor(device="cuda", min_gpus=1, min_gpu_memory_gb=24),
        gates=(Gate("at_least", "rollout/reward_mean", threshold=0.3, after_step=200),),
    )

    @hookimpl
    def register_recipes(register):
        register(COUNTDOWN)

Design and rationale: ``docs/product/recipe-system.md``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path, PureWindowsPath
from typing import Any, Literal

import attrs

from areno_core.config import OPTION_SECTIONS, build_config
from areno_core.errors import ConfigError
from areno_core.options import normalize_key

RESOURCE_PREFIX = "resource:"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*/[a-z0-9][a-z0-9_.-]*$")

# Options a recipe may not set: they choose the recipe and the algorithm themselves.
_RESERVED_OPTIONS = frozenset({"algo", "recipe"})
# Options that only matter when the algorithm rolls out and scores completions. A recipe that
# sets them for every algorithm still works with an offline one (sft, dpo): they are left out.
ROLLOUT_ONLY_OPTIONS = frozenset({"reward_fn_path", "agent_fn", "reward_ckpt"})


@attrs.frozen
class HardwareFloor:
    """The least hardware a recipe is known to run on, as advertised."""

    device: Literal["cpu", "cuda"] = "cpu"
    min_gpus: int = 0
    min_gpu_memory_gb: float = 0.0
    min_cpu_memory_gb: float = 0.0
    note: str = ""

    def __attrs_post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"hardware device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and self.min_gpus < 1:
            raise ValueError("a cuda hardware floor needs min_gpus >= 1")
        if self.min_gpus < 0 or self.min_gpu_memory_gb < 0 or self.min_cpu_memory_gb < 0:
            raise ValueError("hardware floor numbers must be zero or more")

    def describe(self) -> str:
        if self.device == "cpu":
            text = "CPU"
            if self.min_cpu_memory_gb:
                text += f", {self.min_cpu_memory_gb:g} GiB RAM"
        else:
            text = f"{self.min_gpus}x GPU"
            if self.min_gpu_memory_gb:
                text += f" ({self.min_gpu_memory_gb:g} GiB)"
        return text


GateKind = Literal[
    "metric_exists", "finite", "at_least", "at_most", "rises", "falls", "checkpoint_loadable"
]
GATE_KINDS: tuple[str, ...] = (
    "metric_exists",
    "finite",
    "at_least",
    "at_most",
    "rises",
    "falls",
    "checkpoint_loadable",
)


@attrs.frozen
class Gate:
    """A check on a finished run's metrics or checkpoint, evaluated by :mod:`areno_core.gates`.

    The *window* of a metric gate is the logged values of ``metric`` at steps ``>= after_step``
    (every logged value when ``after_step`` is None).

    - ``metric_exists``: the window holds at least one value.
    - ``finite``: the window is not empty and every value in it is finite.
    - ``at_least`` / ``at_most``: compares with ``threshold`` the mean of the window, or the
      last logged value when ``after_step`` is None.
    - ``rises`` / ``falls``: the mean of the last third of the window is above (below) the mean
      of its first third by more than ``threshold`` (default 0); needs two values or more.
    - ``checkpoint_loadable``: the newest complete checkpoint of the run (at step
      ``>= after_step`` when given) loads as a Hugging Face model and gives finite logits.
    """

    kind: GateKind
    metric: str | None = None
    threshold: float | None = None
    after_step: int | None = None
    description: str = ""

    def __attrs_post_init__(self) -> None:
        if self.kind not in GATE_KINDS:
            raise ValueError(f"unknown gate kind {self.kind!r}; kinds: {', '.join(GATE_KINDS)}")
        needs_metric = self.kind != "checkpoint_loadable"
        if needs_metric and not self.metric:
            raise ValueError(f"gate {self.kind!r} needs a metric name")
        if not needs_metric and self.metric:
            raise ValueError("gate 'checkpoint_loadable' takes no metric")
        if self.kind in ("at_least", "at_most") and self.threshold is None:
            raise ValueError(f"gate {self.kind!r} on {self.metric!r} needs a threshold")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(f"gate {self.kind!r}: threshold must be finite")
        if self.kind in ("rises", "falls") and (self.threshold or 0.0) < 0:
            raise ValueError(f"gate {self.kind!r}: threshold is a margin and must be >= 0")
        if self.after_step is not None and self.after_step < 0:
            raise ValueError(f"gate {self.kind!r}: after_step must be zero or more")

    def describe(self) -> str:
        """One line saying what the gate requires, e.g. ``rollout/reward_mean >= 0.3 ...``."""
        window = f" (steps >= {self.after_step})" if self.after_step is not None else ""
        margin = f" by more than {self.threshold:g}" if self.threshold else ""
        if self.kind == "metric_exists":
            text = f"{self.metric} is logged{window}"
        elif self.kind == "finite":
            text = f"{self.metric} is finite{window}"
        elif self.kind in ("at_least", "at_most"):
            op = ">=" if self.kind == "at_least" else "<="
            what = "mean" if self.after_step is not None else "last"
            text = f"{what} {self.metric} {op} {self.threshold:g}{window}"
        elif self.kind in ("rises", "falls"):
            text = f"{self.metric} {self.kind}{margin}{window}"
        else:
            at = f" at step >= {self.after_step}" if self.after_step is not None else ""
            text = f"checkpoint{at} loads"
        return f"{text}: {self.description}" if self.description else text


def _names(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(f"expected a tuple of names, got the string {value!r}")
    return tuple(value)


@attrs.frozen
class Recipe:
    """A public or internal training recipe, registered through ``register_recipes``.

    Option values set by a recipe, lowest precedence first: ``dataset``, ``checkpoint``,
    ``loader``, ``reward`` and ``agent`` (as ``--dataset-path``, ``--ckpt``,
    ``--dataset-loader-fn``, ``--reward-fn-path``, ``--agent-fn``), then ``defaults``, then
    ``algorithm_defaults[algo]``, then, only in a run that trains LoRA adapters
    (``--lora-rank``), ``lora_defaults`` (adapters usually want a larger learning rate than
    full fine-tuning). ``--config`` and explicit flags override all of them.
    """

    name: str
    summary: str
    algorithms: tuple[str, ...] = attrs.field(converter=_names)
    defaults: Mapping[str, Any] = attrs.field(factory=dict)
    algorithm_defaults: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    hardware: HardwareFloor = HardwareFloor()
    dataset: str | None = None
    checkpoint: str | None = None
    lora_required: bool = False
    expected_metrics: Mapping[str, str] = attrs.field(factory=dict)
    gates: tuple[Gate, ...] = attrs.field(default=(), converter=tuple)
    visibility: Literal["public", "internal"] = "public"
    description: str = ""
    loader: str | None = None
    reward: str | None = None
    agent: str | None = None
    lora_defaults: Mapping[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        where = f"recipe {self.name!r}"
        if not _NAME_RE.match(self.name):
            raise ValueError(
                f"recipe name {self.name!r} must look like 'pack/name' (lowercase letters, "
                "digits, '-', '_', '.')"
            )
        if not self.summary.strip():
            raise ValueError(f"{where} needs a one-line summary")
        if not self.algorithms:
            raise ValueError(f"{where} must support at least one algorithm")
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"{where} lists an algorithm twice: {list(self.algorithms)}")
        if self.visibility not in ("public", "internal"):
            raise ValueError(f"{where}: visibility must be 'public' or 'internal'")
        extra = set(self.algorithm_defaults) - set(self.algorithms)
        if extra:
            raise ValueError(
                f"{where} has defaults for {sorted(extra)} which it does not "
                f"list in algorithms {list(self.algorithms)}"
            )
        if any(normalize_key(str(k)) == "lora_rank" for k in self.lora_defaults):
            raise ValueError(
                f"{where}: lora_defaults may not set lora_rank (they apply once LoRA is on); "
                "set it in defaults"
            )
        for gate in self.gates:
            if not isinstance(gate, Gate):
                raise ValueError(f"{where}: gates must be Gate objects, got {gate!r}")
        for source, options in self._layers():
            for key, value in options.items():
                _check_option(where, source, key, value)
        for algo in self.algorithms:
            # Core option values are checked now; plugin options (an algorithm's, an engine's)
            # when the registry knows who declares them (see Registry._check_recipe).
            for lora in (False, True) if self.lora_defaults else (False,):
                raw = self._raw_options(algo, lora=lora)
                core = {k: v for k, v in raw.items() if k in OPTION_SECTIONS}
                try:
                    build_config(core)
                except ConfigError as exc:
                    with_lora = " with LoRA" if lora else ""
                    raise ValueError(f"{where} with --algo {algo}{with_lora}: {exc}") from exc

    # -- what the recipe sets ----------------------------------------------------------------

    def _layers(self) -> list[tuple[str, Mapping[str, Any]]]:
        fields = {
            "dataset_path": self.dataset,
            "ckpt": self.checkpoint,
            "dataset_loader_fn": self.loader,
            "reward_fn_path": self.reward,
            "agent_fn": self.agent,
        }
        layers: list[tuple[str, Mapping[str, Any]]] = [
            ("fields", {k: v for k, v in fields.items() if v is not None}),
            ("defaults", self.defaults),
        ]
        layers += [(f"algorithm_defaults[{a!r}]", d) for a, d in self.algorithm_defaults.items()]
        layers.append(("lora_defaults", self.lora_defaults))
        return layers

    def _raw_options(
        self, algo: str, *, rollout: bool = True, lora: bool = False
    ) -> dict[str, Any]:
        options: dict[str, Any] = {}
        own = f"algorithm_defaults[{algo!r}]"
        for source, layer in self._layers():
            per_algorithm = source.startswith("algorithm_defaults")
            if per_algorithm and source != own:
                continue
            if source == "lora_defaults" and not lora:
                continue
            for key, value in layer.items():
                name = normalize_key(str(key))
                if not rollout and not per_algorithm and name in ROLLOUT_ONLY_OPTIONS:
                    continue
                options[name] = value
        return options

    @property
    def pack(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def internal(self) -> bool:
        return self.visibility == "internal"

    def options_for(
        self, algo: str, *, rollout: bool = True, resolve: bool = True, lora: bool = False
    ) -> dict[str, Any]:
        """The option values this recipe sets when run with ``algo``, ``resource:`` resolved
        (with ``resolve=False`` left as written, for a caller that resolves only the values
        the user does not override); with ``lora``, its ``lora_defaults`` on top.

        With ``rollout=False`` (an algorithm that does not roll out, such as sft or dpo) the
        recipe-wide reward and agent are left out; per-algorithm values are always kept.
        """
        if algo not in self.algorithms:
            raise ConfigError(
                f"recipe {self.name!r} does not support --algo {algo!r}; it supports: "
                f"{', '.join(self.algorithms)}"
            )
        raw = self._raw_options(algo, rollout=rollout, lora=lora)
        return {k: resolve_resource(v) for k, v in raw.items()} if resolve else raw

    def uses_lora(self, algo: str, user: Mapping[str, Any]) -> bool:
        """Whether a run of this recipe with ``algo`` and the user's options trains LoRA
        adapters: ``lora_rank`` set by the user, else by the recipe."""
        if "lora_rank" in user:
            return user["lora_rank"] is not None
        return self._raw_options(algo).get("lora_rank") is not None


def _check_option(where: str, source: str, key: str, value: Any) -> None:
    name = normalize_key(str(key))
    if name in _RESERVED_OPTIONS:
        raise ValueError(f"{where}: {source} may not set {name!r}; the command line chooses it")
    if not isinstance(value, str):
        return
    if value.startswith(RESOURCE_PREFIX):
        _parse_resource(value)  # syntax only; the package is looked up when the recipe is used
        return
    if value.startswith(("/", "~", "\\")) or PureWindowsPath(value).is_absolute():
        raise ValueError(
            f"{where}: {name}={value!r} is an absolute path; reference package files as "
            f"'{RESOURCE_PREFIX}package/relative/path' (or use a registry name or hub id)"
        )


def _parse_resource(value: str) -> tuple[str, str, str | None]:
    """Split ``resource:package/rel/path[:function]`` into (package, rel, function)."""
    ref = value[len(RESOURCE_PREFIX) :]
    package, _, rel = ref.partition("/")
    function: str | None = None
    if ".py:" in rel:
        rel, _, function = rel.rpartition(":")
        if not function.isidentifier():
            raise ConfigError(f"{value!r}: {function!r} is not a Python function name")
    if not package or not all(part.isidentifier() for part in package.split(".")):
        raise ConfigError(
            f"{value!r}: expected '{RESOURCE_PREFIX}package/relative/path' with an importable "
            "package name"
        )
    parts = [p for p in rel.split("/") if p]
    if rel.startswith("/") or any(p in ("..", ".") for p in parts) or "\\" in rel:
        raise ConfigError(f"{value!r}: the path inside the package must be relative, without '..'")
    return package, "/".join(parts), function


def resolve_resource(value: Any) -> Any:
    """Turn ``resource:package/path[:function]`` into a filesystem path inside the package.

    Other values are returned unchanged. A missing package or file is a :class:`ConfigError`.
    """
    if not isinstance(value, str) or not value.startswith(RESOURCE_PREFIX):
        return value
    package, rel, function = _parse_resource(value)
    try:
        root = resources.files(package)
    except (ModuleNotFoundError, TypeError, ValueError) as exc:
        raise ConfigError(f"{value!r}: package {package!r} is not installed") from exc
    target = root.joinpath(*rel.split("/")) if rel else root
    if not target.is_file() and not target.is_dir():
        raise ConfigError(f"{value!r}: no file {rel!r} inside package {package!r}")
    if not isinstance(target, Path):
        raise ConfigError(
            f"{value!r}: package {package!r} is not installed as files on disk (zipped?); "
            "install it unpacked"
        )
    path = str(target)
    return f"{path}:{function}" if function else path

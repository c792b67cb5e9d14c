"""Recipes: named, versioned bundles of defaults and metadata for ``areno train --recipe``.

A recipe never runs code of its own: it names a dataset, a loader, a reward, an agent and a
checkpoint (by registry name or by a file shipped inside its package), fills option defaults for
each algorithm it supports, and states what a good run looks like (expected metrics and
validation gates) and what hardware it needs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from typing import Any, Literal

import attrs

from areno_core.errors import ConfigError

RESOURCE_PREFIX = "resource:"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*/[a-z0-9][a-z0-9_.-]*$")


@attrs.frozen
class HardwareFloor:
    """The least hardware a recipe is known to run on, as advertised."""

    device: Literal["cpu", "cuda"] = "cpu"
    min_gpus: int = 0
    min_gpu_memory_gb: float = 0.0
    min_cpu_memory_gb: float = 0.0
    note: str = ""

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


GateKind = Literal["metric_exists", "finite", "at_least", "at_most", "rises", "checkpoint_loadable"]


@attrs.frozen
class Gate:
    """A check on a finished run's metrics or outputs, evaluated by code (see recipes/gates)."""

    kind: GateKind
    metric: str | None = None
    threshold: float | None = None
    after_step: int | None = None
    description: str = ""

    def __attrs_post_init__(self) -> None:
        needs_metric = self.kind != "checkpoint_loadable"
        if needs_metric and not self.metric:
            raise ValueError(f"gate {self.kind!r} needs a metric name")
        if self.kind in ("at_least", "at_most") and self.threshold is None:
            raise ValueError(f"gate {self.kind!r} on {self.metric!r} needs a threshold")


@attrs.frozen
class Recipe:
    """A public or internal training recipe, registered through ``register_recipes``."""

    name: str
    summary: str
    algorithms: tuple[str, ...]
    defaults: Mapping[str, Any] = attrs.field(factory=dict)
    algorithm_defaults: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    hardware: HardwareFloor = HardwareFloor()
    dataset: str | None = None
    checkpoint: str | None = None
    lora_required: bool = False
    expected_metrics: Mapping[str, str] = attrs.field(factory=dict)
    gates: tuple[Gate, ...] = ()
    visibility: Literal["public", "internal"] = "public"
    description: str = ""

    def __attrs_post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(
                f"recipe name {self.name!r} must look like 'pack/name' (lowercase letters, "
                "digits, '-', '_', '.')"
            )
        if not self.algorithms:
            raise ValueError(f"recipe {self.name!r} must support at least one algorithm")
        extra = set(self.algorithm_defaults) - set(self.algorithms)
        if extra:
            raise ValueError(
                f"recipe {self.name!r} has defaults for {sorted(extra)} which it does not "
                f"list in algorithms {list(self.algorithms)}"
            )
        for key, value in {**self.defaults, "dataset": self.dataset}.items():
            if isinstance(value, str) and value.startswith("/"):
                raise ValueError(
                    f"recipe {self.name!r}: {key}={value!r} is an absolute path; reference "
                    f"package files as '{RESOURCE_PREFIX}package/relative/path'"
                )

    @property
    def pack(self) -> str:
        return self.name.split("/", 1)[0]

    def options_for(self, algo: str) -> dict[str, Any]:
        """The option values this recipe sets when run with ``algo``."""
        if algo not in self.algorithms:
            raise ConfigError(
                f"recipe {self.name!r} does not support --algo {algo!r}; it supports: "
                f"{', '.join(self.algorithms)}"
            )
        options: dict[str, Any] = {}
        if self.dataset is not None:
            options["dataset_path"] = self.dataset
        if self.checkpoint is not None:
            options["ckpt"] = self.checkpoint
        options.update(self.defaults)
        options.update(self.algorithm_defaults.get(algo, {}))
        return {k: resolve_resource(v) for k, v in options.items()}


def resolve_resource(value: Any) -> Any:
    """Turn ``resource:package/path`` into a filesystem path inside the installed package."""
    if not isinstance(value, str) or not value.startswith(RESOURCE_PREFIX):
        return value
    ref = value[len(RESOURCE_PREFIX) :]
    package, _, rel = ref.partition("/")
    try:
        root = resources.files(package)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{value!r}: package {package!r} is not installed") from exc
    target = root.joinpath(*rel.split("/")) if rel else root
    if not target.is_file() and not target.is_dir():
        raise ConfigError(f"{value!r}: no file {rel!r} inside package {package!r}")
    return str(target)

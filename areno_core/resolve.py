"""Resolve a run's options: defaults < recipe < --config YAML < explicit flags, then validate.

Everything here is cheap: no model, dataset or device is touched, so every bad input is
reported before any expensive work starts.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs

from areno_core.config import (
    RunConfig,
    build_config,
    check_consistency,
    load_yaml_options,
)
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.log import get_logger
from areno_core.recipe import Recipe, resolve_resource
from areno_core.registry import Registry

logger = get_logger(__name__)


@attrs.frozen
class ResolvedRun:
    config: RunConfig
    explicit: frozenset[str]  # options set by --config or flags
    recipe_options: Mapping[str, Any]
    recipe: Recipe | None = None


def machine_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # torch missing or broken CUDA: behave as CPU-only
        return 0


def resolve_run(
    flags: Mapping[str, Any],
    *,
    registry: Registry,
    config_path: str | None = None,
    check_capabilities: bool = True,
) -> ResolvedRun:
    """Merge option layers and validate them against the registry and this machine."""
    file_options = load_yaml_options(config_path) if config_path else {}
    user = {**file_options, **flags}
    recipe_name = user.get("recipe")
    recipe: Recipe | None = None
    recipe_options: dict[str, Any] = {}
    if recipe_name:
        recipe = find_recipe(registry, recipe_name)
        recipe_options = recipe_layer(recipe, registry, user.get("algo"))
        _check_recipe_fits(recipe, check_capabilities=check_capabilities)
    # A recipe's packaged files (``resource:``) are looked up only where the user keeps the
    # recipe's value: --ckpt my-model must not need the recipe's checkpoint to be installed.
    from_recipe = {k: resolve_resource(v) for k, v in recipe_options.items() if k not in user}
    cfg = build_config({**from_recipe, **user})
    cfg = _fill_machine_defaults(cfg)
    # A config file may restate defaults (a run's own config.yaml does): only values that
    # differ from the built-in defaults count as set by the user.
    defaults = RunConfig().flat()
    chosen = set(flags) | {k for k, v in file_options.items() if v != defaults.get(k)}
    check_consistency(cfg, explicit=chosen)

    spec = registry.algorithm(cfg.algo)
    _warn_foreign_algorithm_flags(cfg.algo, chosen)
    if not spec.needs_rollout:
        for name in ("agent_fn", "reward_fn_path", "reward_ckpt"):
            if getattr(cfg, name) is not None:
                raise ConfigError(
                    f"--{name.replace('_', '-')} is for online RL algorithms; --algo "
                    f"{cfg.algo} ({spec.kind}) does not roll out or score completions"
                )
    if cfg.ckpt is None:
        raise ConfigError(
            "--ckpt is required: a local model directory, a Hugging Face id, or a random "
            "model such as random:qwen3-tiny"
        )
    if cfg.dataset_path is None:
        raise ConfigError("--dataset-path is required (or a --recipe that provides one)")
    if check_capabilities:
        check_available(cfg)
    return ResolvedRun(cfg, frozenset(user), recipe_options, recipe)


# -- recipes -------------------------------------------------------------------------------


def find_recipe(registry: Registry, name: str) -> Recipe:
    """The recipe registered as ``name``; an unknown name suggests close public names.

    Internal recipes are found by their exact name but suggested only to a caller who already
    names their pack (``smoke/sf`` may suggest ``smoke/sft``; ``sft`` never does).
    """
    table = registry.entries["recipes"]
    if name in table:
        return table[name].obj
    everything = registry.recipes(include_internal=True)
    close = _close_recipes(name, everything)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    public = [r.name for r in everything if not r.internal]
    if public:
        listing = f"Public recipes: {', '.join(public)} (see `areno train --list-recipes`)."
    else:
        listing = (
            "No public recipes are installed. Install a recipe pack, e.g.: pip install "
            "areno-recipes-math"
        )
    if "/" not in name:
        listing = f"Recipe names look like 'pack/name'. {listing}"
    raise ConfigError(f"unknown recipe {name!r}.{hint} {listing}")


def _close_recipes(name: str, recipes: list[Recipe]) -> list[str]:
    """Names close to ``name``: the short name within its pack, else the same short name
    elsewhere, else a close full name. Internal recipes only when ``name`` names their pack."""
    pack, _, short = name.rpartition("/")
    candidates = [r for r in recipes if not r.internal or r.pack == pack]
    by_short: dict[str, list[str]] = {}
    for r in candidates:
        if not pack or r.pack == pack:
            by_short.setdefault(r.name.split("/", 1)[1], []).append(r.name)
    close = difflib.get_close_matches(short, list(by_short), n=3, cutoff=0.6)
    if close:
        return [full for s in close for full in by_short[s]][:3]
    same_short = [r.name for r in candidates if r.name.split("/", 1)[1] == short]
    if same_short:
        return same_short[:3]
    return difflib.get_close_matches(name, [r.name for r in candidates], n=3, cutoff=0.8)


def recipe_algorithm(recipe: Recipe, algo: str | None) -> str:
    """The algorithm a recipe runs with: ``--algo``, else its only one, else the default."""
    if algo:
        return algo
    if len(recipe.algorithms) == 1:
        return recipe.algorithms[0]
    default = RunConfig().algo
    if default not in recipe.algorithms:
        raise ConfigError(
            f"recipe {recipe.name!r} supports several algorithms "
            f"({', '.join(recipe.algorithms)}); choose one with --algo"
        )
    return default


def recipe_layer(recipe: Recipe, registry: Registry, algo: str | None) -> dict[str, Any]:
    """The options ``recipe`` sets for ``algo`` (``--algo`` or the recipe's), algo included.

    A recipe-wide reward or agent is left out for algorithms that do not roll out; ``resource:``
    references are left as written (``resolve_run`` resolves the ones the user keeps).
    """
    chosen = recipe_algorithm(recipe, algo)
    entry = registry.entries["algorithms"].get(chosen)
    rollout = entry.obj.needs_rollout if entry is not None else True
    return {"algo": chosen, **recipe.options_for(chosen, rollout=rollout, resolve=False)}


def _check_recipe_fits(recipe: Recipe, *, check_capabilities: bool) -> None:
    if recipe.internal:
        logger.warning(
            "recipe %s is internal (for maintainers' smoke and release checks): not a public "
            "API, it may change or go away without notice",
            recipe.name,
        )
    if not check_capabilities:
        return
    if recipe.lora_required:
        raise NotAvailableError(
            f"recipe {recipe.name!r} needs LoRA adapters, which this build of areno does not "
            "support yet; `--dry-run` still shows what the recipe sets"
        )
    floor = recipe.hardware
    if floor.device == "cuda":
        gpus = machine_device_count()
        if gpus < floor.min_gpus:
            logger.warning(
                "recipe %s is sized for %s; this machine has %s. It may be very slow or run "
                "out of memory; override its options to shrink the run",
                recipe.name,
                floor.describe(),
                f"{gpus} GPU(s)" if gpus else "no GPU",
            )


def _fill_machine_defaults(cfg: RunConfig) -> RunConfig:
    updates: dict[str, Any] = {}
    if cfg.world_size is None:
        updates["world_size"] = max(1, machine_device_count())
    if cfg.tp_size is None:
        updates["tp_size"] = 1
    return cfg.replace(**updates) if updates else cfg


# Options that only some algorithms read; set explicitly for another algorithm they are named
# in a warning, so nothing is accepted and silently ignored.
ALGORITHM_OPTIONS: dict[str, tuple[str, ...]] = {
    "dpo_beta": ("dpo",),
    "gspo_clip_eps": ("gspo",),
    "gspo_clip_eps_high": ("gspo",),
    "grpo_clip_eps": ("grpo",),
    "grpo_clip_eps_high": ("grpo",),
    "scale_rewards": ("grpo",),
    "critic_ckpt": ("ppo",),
    "critic_lr": ("ppo",),
    "critic_warmup_steps": ("ppo",),
    "use_kl_loss": ("ppo",),
    "kl_loss_coef": ("ppo",),
    "kl_loss_type": ("ppo",),
    "clip_eps": ("ppo", "rloo"),
    "clip_ratio_c": ("ppo",),
    "value_clip_eps": ("ppo",),
    "value_loss_coef": ("ppo",),
    "gamma": ("ppo",),
    "lam": ("ppo",),
    "reward_ckpt": ("ppo",),
    "ref_ckpt": ("dpo", "ppo"),
}


def _warn_foreign_algorithm_flags(algo: str, explicit: set[str]) -> None:
    for name in sorted(explicit):
        users = ALGORITHM_OPTIONS.get(name)
        if users and algo in _KNOWN_ALGOS and algo not in users:
            logger.warning(
                "--%s applies to %s only; it has no effect with --algo %s",
                name.replace("_", "-"),
                "/".join(users),
                algo,
            )


_KNOWN_ALGOS = {"sft", "dpo", "grpo", "gspo", "rloo", "ppo"}

# Capabilities that are declared in the CLI but not built yet. Each entry names the option,
# a predicate on the config, and why.
_NOT_YET: list[tuple[str, Any, str]] = [
    ("tune_params", lambda c: c.tune_params, "memory probing (--tune-params)"),
]


def check_available(cfg: RunConfig) -> None:
    """Fail clearly on options whose capability is not available in this build or machine."""
    for name, predicate, what in _NOT_YET:
        if predicate(cfg):
            raise NotAvailableError(
                f"--{name.replace('_', '-')}: {what} is not available yet in areno "
                f"{_version()}; run without it"
            )
    if cfg.world_size > 1 or cfg.tp_size > 1:
        raise NotAvailableError(
            f"--world-size {cfg.world_size} / --tp-size {cfg.tp_size}: multi-device training "
            "is not available yet; use --world-size 1 --tp-size 1"
        )


def _version() -> str:
    from areno_core import __version__

    return __version__

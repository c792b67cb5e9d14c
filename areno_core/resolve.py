"""Resolve a run's options: defaults < recipe < --config YAML < explicit flags, then validate.

Everything here is cheap: no model, dataset or device is touched, so every bad input is
reported before any expensive work starts.
"""

from __future__ import annotations

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
from areno_core.registry import Registry

logger = get_logger(__name__)


@attrs.frozen
class ResolvedRun:
    config: RunConfig
    explicit: frozenset[str]  # options set by --config or flags
    recipe_options: Mapping[str, Any]


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
    recipe_options: dict[str, Any] = {}
    if recipe_name:
        recipe = registry.recipe(recipe_name)
        algo = user.get("algo") or (recipe.algorithms[0] if len(recipe.algorithms) == 1 else None)
        if algo is None:
            algo = RunConfig().algo
            if algo not in recipe.algorithms:
                raise ConfigError(
                    f"recipe {recipe.name!r} supports several algorithms "
                    f"({', '.join(recipe.algorithms)}); choose one with --algo"
                )
        recipe_options = {"algo": algo, **recipe.options_for(algo)}
    cfg = build_config({**recipe_options, **user})
    cfg = _fill_machine_defaults(cfg)
    check_consistency(cfg, explicit=set(user))

    spec = registry.algorithm(cfg.algo)
    _warn_foreign_algorithm_flags(cfg.algo, set(user))
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
    return ResolvedRun(cfg, frozenset(user), recipe_options)


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

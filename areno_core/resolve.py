"""Resolve a run's options: defaults < recipe < --config YAML < explicit flags, then validate.

Everything here is cheap: no model, dataset or device is touched, so every bad input is
reported before any expensive work starts.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from areno_core import __version__
from areno_core.algorithm import AlgorithmSpec
from areno_core.config import (
    ROLE_OPTIONS,
    RunConfig,
    build_config,
    check_consistency,
    default_of,
    flatten_saved_config,
    load_yaml_options,
)
from areno_core.contracts.backend import BackendSpec
from areno_core.contracts.engine import EngineSpec
from areno_core.errors import ConfigError, NotAvailableError, did_you_mean
from areno_core.log import get_logger
from areno_core.models.lora import check_peft_available
from areno_core.options import OptionTable, Owner
from areno_core.recipe import Recipe, resolve_resource
from areno_core.registry import Registry
from areno_core.runner.async_options import check_async_options
from areno_core.train.checkpoint import read_checkpoint_config, resolve_resume
from areno_core.train.distributed import launched_world_size
from areno_core.tune.checks import check_tunable
from areno_core.validators import flag

logger = get_logger(__name__)


@attrs.frozen
class ResolvedRun:
    """A run's options after every layer, checked, with the plugins that will run it."""

    config: RunConfig
    explicit: frozenset[str]  # options set by --config or flags
    recipe_options: Mapping[str, Any]
    recipe: Recipe | None
    algorithm: AlgorithmSpec
    algorithm_config: Any
    backend: BackendSpec | None  # None only in a dry run no installed backend can run
    backend_config: Any
    engine: EngineSpec | None = None  # online algorithms only
    engine_config: Any = None
    resume_from: Path | None = None  # the checkpoint the run continues

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Every resolved option, by section: the core's, then the algorithm's, the rollout
        engine's and the backend's own (what ``config.yaml`` records; ``--config`` reads it)."""
        out: dict[str, dict[str, Any]] = self.config.to_dict()
        owned = (
            ("algorithm", self.algorithm_config),
            ("rollout_engine", self.engine_config),
            ("backend", self.backend_config),
        )
        for key, value in owned:
            if value is not None and attrs.fields(type(value)):
                out[key] = attrs.asdict(value)
        return out


def machine_device_count() -> int:
    try:
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
    table = registry.options
    file_options = load_yaml_options(config_path, table) if config_path else {}
    user = {**file_options, **flags}
    recipe, recipe_options = _recipe_and_options(
        registry, user, check_capabilities=check_capabilities
    )
    # A recipe's packaged files (``resource:``) are looked up only where the user keeps the
    # recipe's value: --ckpt my-model must not need the recipe's checkpoint to be installed.
    from_recipe = {k: resolve_resource(v) for k, v in recipe_options.items() if k not in user}
    cfg = build_config({**from_recipe, **user}, table=table)
    # A config file may restate defaults (a run's own config.yaml does): only values that
    # differ from the built-in defaults count as set by the user.
    chosen = set(flags) | {k for k, v in file_options.items() if v != table.default(k)}
    resume_from = resolve_resume(cfg.resume, cfg.save_path) if cfg.resume else None
    if resume_from is not None:
        cfg = _resumed_under_launcher(resumed_config(cfg, resume_from, chosen, table), chosen)
    cfg = _fill_machine_defaults(cfg, given="world_size" in user)
    check_consistency(cfg, explicit=chosen)

    spec = registry.algorithm(cfg.algo)
    _check_groups(spec, cfg)
    algorithm_config = spec.make_config(cfg.plugin)
    engine = engine_config = None
    if spec.needs_rollout:
        engine = registry.engine(cfg.rollout_engine)
        engine_config = engine.make_config(cfg.plugin)
    backend = choose_backend(cfg, registry, required=check_capabilities)
    backend_config = backend.make_config(cfg.plugin) if backend is not None else None
    _check_options_used(table, chosen, cfg, spec, registry, backend=backend, engine=engine)
    _check_required(cfg, recipe, check_capabilities=check_capabilities)
    if check_capabilities:
        check_available(cfg)
        if engine is not None:
            why = engine.unavailable(cfg, engine_config)
            if why is not None:
                raise NotAvailableError(f"--rollout-engine {engine.name}: {why}")

    check_tunable(cfg, spec, flags)
    return ResolvedRun(
        cfg,
        frozenset(user),
        recipe_options,
        recipe,
        spec,
        algorithm_config,
        backend,
        backend_config,
        engine,
        engine_config,
        resume_from,
    )


def _recipe_and_options(
    registry: Registry, user: Mapping[str, Any], *, check_capabilities: bool
) -> tuple[Recipe | None, dict[str, Any]]:
    """The recipe the user named (None without ``--recipe``) and the options it sets, with
    its LoRA layer where the run uses LoRA."""
    recipe_name = user.get("recipe")
    if not recipe_name:
        return None, {}
    recipe = find_recipe(registry, recipe_name)
    recipe_options = recipe_layer(recipe, registry, user.get("algo"))
    if recipe.uses_lora(recipe_options["algo"], user):
        recipe_options = recipe_layer(recipe, registry, user.get("algo"), lora=True)
    _check_recipe_fits(recipe, check_capabilities=check_capabilities)
    return recipe, recipe_options


def _resumed_under_launcher(cfg: RunConfig, chosen: set[str]) -> RunConfig:
    """Under torchrun the launcher's process count is the run's, whatever the saved run used."""
    launched = launched_world_size()
    if launched is not None and "world_size" not in chosen:
        return cfg.replace(world_size=launched)
    return cfg


def _check_groups(spec: AlgorithmSpec, cfg: RunConfig) -> None:
    if spec.needs_groups and cfg.n_samples < 2:
        raise ConfigError(
            f"--algo {spec.name} compares each sample with the other samples of its prompt, so "
            f"--n-samples {cfg.n_samples} gives every sample an advantage of 0 and nothing "
            "would be trained; use --n-samples 2 or more"
        )


def _check_options_used(
    table: OptionTable,
    chosen: set[str],
    cfg: RunConfig,
    spec: AlgorithmSpec,
    registry: Registry,
    *,
    backend: BackendSpec | None,
    engine: EngineSpec | None,
) -> None:
    """Every option the user set belongs to a plugin or role that this run uses."""
    active = {("algorithm", spec.name), ("training backend", cfg.backend or "")}
    if backend is not None:
        active.add(("training backend", backend.name))
    if engine is not None:
        active.add(("rollout engine", engine.name))
    _check_plugin_options(table, chosen, active, cfg)
    _check_role_options(spec, registry, chosen, cfg)
    check_async_options(cfg, spec, chosen)


def _check_required(cfg: RunConfig, recipe: Recipe | None, *, check_capabilities: bool) -> None:
    """The options every run needs, and LoRA where the recipe needs it (a warning only in a
    dry run)."""
    if cfg.ckpt is None:
        raise ConfigError(
            "--ckpt is required: a local model directory, a Hugging Face id, or a random "
            "model such as random:qwen3-tiny"
        )
    if cfg.dataset_path is None:
        raise ConfigError("--dataset-path is required (or a --recipe that provides one)")
    if recipe is not None and recipe.lora_required and cfg.lora_rank is None:
        message = (
            f"recipe {recipe.name!r} needs LoRA adapters (it fits its hardware floor only with "
            "them): add --lora-rank, e.g. --lora-rank 16 (see docs/lora.md); `--dry-run` "
            "shows what the recipe sets"
        )
        if check_capabilities:
            raise ConfigError(message)
        logger.warning("%s", message)


# What a resumed run may change: how it runs and for how long, never what it trains. Any other
# option given with --resume must equal the saved run's value (a plugin's option too, unless it
# is declared with ``option(..., resume_may_change=True)``; a training backend's own options may
# change, as the backend may).
RESUME_MAY_CHANGE = frozenset(
    {
        "resume", "save_path", "save_interval", "max_steps", "epochs", "metrics_log_dir",
        "eval_dataset_path", "eval_interval", "eval_limit", "world_size", "tp_size", "backend",
        "max_running_prompts", "attn_backend", "eager_decode", "drop_rollout_state",
        "agent_timeout_s", "activation_checkpointing", "tune_params", "mem_frac",
        "tune_max_samples", "rollout_threads", "save_merged", "report_to",
    }
)  # fmt: skip


def resumed_config(
    cfg: RunConfig, checkpoint: Path, chosen: set[str], table: OptionTable
) -> RunConfig:
    """The options of a resumed run: the saved run's, with the options the user set again
    applied only where they may change (:data:`RESUME_MAY_CHANGE`, and plugin options declared
    with ``resume_may_change``). A different value for
    anything else (the algorithm, model, data, learning rate, ...) is refused, listing every
    difference, so the recorded config.yaml never lies about what was trained."""
    saved, unknown = flatten_saved_config(read_checkpoint_config(checkpoint), table)
    if unknown:
        logger.warning(
            "the checkpoint's config.yaml sets options this installation does not declare "
            "(ignored): %s",
            ", ".join(flag(n) for n in unknown),
        )
    given = {**cfg.flat(), **cfg.plugin}
    changed: dict[str, Any] = {}
    refused = []
    for name in sorted(chosen & set(given)):
        before = saved.get(name, table.default(name))
        now = table.coerce(name, given[name])
        if table.coerce(name, before) == now:
            continue
        if (
            name in RESUME_MAY_CHANGE
            or table.field(name).metadata.get("resume_may_change")
            or _is_backend_option(table, name)
        ):
            changed[name] = now
        else:
            refused.append(f"{flag(name)} {before!r} -> {now!r}")
    if refused:
        raise ConfigError(
            f"--resume {str(checkpoint)!r} continues a run with fixed options, but this command "
            f"changes {', '.join(refused)}. Drop those flags to continue the run as it was "
            "(options not given are taken from the checkpoint), or start a new run from its "
            f"weights: --ckpt {str(checkpoint)!r} with another --save-path"
        )
    if changed:
        logger.warning(
            "resuming with changed options: %s",
            ", ".join(f"{flag(k)} {v!r}" for k, v in changed.items()),
        )
    return build_config({**saved, **changed, "resume": cfg.resume}, table=table)


def _is_backend_option(table: OptionTable, name: str) -> bool:
    """Whether only training backends declare ``name``: how a run trains, not what (the
    backend itself may change on resume)."""
    declared = table.declared.get(name)
    owners = declared.owners if declared is not None else ()
    return bool(owners) and all(o.kind == "training backend" for o in owners)


def choose_backend(cfg: RunConfig, registry: Registry, *, required: bool = True) -> Any:
    """``--backend``, checked against the run; else the first registered backend that can run
    ``--world-size`` x ``--tp-size``. None (only when not ``required``) if none can."""
    if cfg.backend is not None:
        spec = registry.backend(cfg.backend)
        why = spec.check(cfg)
        if why is not None and required:
            raise NotAvailableError(f"--backend {spec.name} cannot run this configuration: {why}")
        return spec
    reasons = []
    for name, entry in registry.entries["backends"].items():
        why = entry.obj.check(cfg)
        if why is None:
            return entry.obj
        reasons.append(f"{name}: {why}")
    if not required:
        return None
    # A backend that runs this many processes and devices but refuses another option of the
    # run holds the real reason; "install another backend" would mislead.
    shape = RunConfig().replace(world_size=cfg.world_size, tp_size=cfg.tp_size)
    sized = [
        f"the {name} backend cannot run this configuration: {entry.obj.check(cfg)}"
        for name, entry in registry.entries["backends"].items()
        if entry.obj.check(shape) is None
    ]
    if sized:
        raise NotAvailableError(
            f"--world-size {cfg.world_size} --tp-size {cfg.tp_size}: " + "; ".join(sized)
        )
    raise NotAvailableError(
        f"no installed training backend runs --world-size {cfg.world_size} --tp-size "
        f"{cfg.tp_size} ({'; '.join(reasons) or 'none is installed'}). Use --world-size 1 "
        "--tp-size 1, or install a backend that runs several devices"
    )


def _check_plugin_options(
    table: OptionTable, chosen: set[str], active: set[tuple[str, str]], cfg: RunConfig
) -> None:
    """Warn about options set for an algorithm or backend this run does not use; an option
    of a rollout engine the run does not use is an error (``--sglang-url`` without
    ``--rollout-engine sglang`` would otherwise sample on another engine than the user
    pointed at, with nothing but a warning to say so)."""
    for name in sorted(chosen):
        if name not in table or table.is_core(name):
            continue
        owners = table.owners(name)
        if any((o.kind, o.name) in active for o in owners):
            continue
        engines = [o.name for o in owners if o.kind == "rollout engine"]
        if engines and len(engines) == len(owners):
            samples = any(kind == "rollout engine" for kind, _ in active)
            how = (
                f"samples with --rollout-engine {cfg.rollout_engine}"
                if samples
                else f"(--algo {cfg.algo}) samples nothing"
            )
            raise ConfigError(
                f"{flag(name)} is an option of {_owner_list(owners)}, but this run {how}; "
                + (f"add --rollout-engine {engines[0]} or " if samples else "")
                + f"drop {flag(name)}"
            )
        logger.warning(
            "%s is an option of %s; this run (%s) does not read it",
            flag(name),
            _owner_list(owners),
            _run_description(cfg, owners),
        )


def _owner_list(owners: tuple[Owner, ...]) -> str:
    return ", ".join(o.label for o in owners)


def _run_description(cfg: RunConfig, owners: tuple[Owner, ...]) -> str:
    kinds = {o.kind for o in owners}
    parts = []
    if "algorithm" in kinds:
        parts.append(f"--algo {cfg.algo}")
    if "rollout engine" in kinds:
        parts.append(f"--rollout-engine {cfg.rollout_engine}")
    if "training backend" in kinds:
        parts.append(f"--backend {cfg.backend or 'auto'}")
    return ", ".join(parts)


_ROLE_NOUNS = {
    "reference": "a reference model",
    "critic": "a critic",
    "reward_model": "a reward model",
}


def _check_role_options(
    spec: AlgorithmSpec, registry: Registry, chosen: set[str], cfg: RunConfig
) -> None:
    """Options for a model role the algorithm has not: a reward model would still score
    samples, so it is refused; the others are named in a warning."""
    if not spec.needs_rollout:
        for name in ("agent_fn", "reward_fn_path", "reward_ckpt"):
            if getattr(cfg, name) is not None:
                raise ConfigError(
                    f"{flag(name)} is for online RL algorithms; --algo {cfg.algo} "
                    f"({spec.kind}) does not roll out or score completions"
                )
    for name in sorted(chosen):
        role = ROLE_OPTIONS.get(name)
        if role is None or spec.accepts(role):
            continue
        users = [e.name for e in registry.entries["algorithms"].values() if e.obj.accepts(role)]
        text = (
            f"{flag(name)} applies to algorithms that use {_ROLE_NOUNS[role]} "
            f"({', '.join(users) or 'none installed'}); --algo {cfg.algo} does not"
        )
        if role == "reward_model" and cfg.reward_ckpt is not None:
            raise ConfigError(text)
        logger.warning("%s", text)


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
    hint = did_you_mean(name, close, cutoff=0.0)
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
    default = default_of("algo")
    if default not in recipe.algorithms:
        raise ConfigError(
            f"recipe {recipe.name!r} supports several algorithms "
            f"({', '.join(recipe.algorithms)}); choose one with --algo"
        )
    return default


def recipe_layer(
    recipe: Recipe, registry: Registry, algo: str | None, *, lora: bool = False
) -> dict[str, Any]:
    """The options ``recipe`` sets for ``algo`` (``--algo`` or the recipe's), algo included;
    with ``lora`` (the run trains LoRA adapters) its ``lora_defaults`` too.

    A recipe-wide reward or agent is left out for algorithms that do not roll out; ``resource:``
    references are left as written (``resolve_run`` resolves the ones the user keeps).
    """
    chosen = recipe_algorithm(recipe, algo)
    # An algorithm that is not installed is named as such here, before the recipe's options
    # for it (gspo_clip_eps, ...) read as unknown options.
    rollout = registry.algorithm(chosen).needs_rollout
    options = recipe.options_for(chosen, rollout=rollout, resolve=False, lora=lora)
    return {"algo": chosen, **options}


def _check_recipe_fits(recipe: Recipe, *, check_capabilities: bool) -> None:
    if recipe.internal:
        logger.warning(
            "recipe %s is internal (for maintainers' smoke and release checks): not a public "
            "API, it may change or go away without notice",
            recipe.name,
        )
    if not check_capabilities:
        return
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


def _fill_machine_defaults(cfg: RunConfig, *, given: bool) -> RunConfig:
    """One device unless told otherwise (or started by torchrun); a machine with several GPUs
    gets a notice."""
    updates: dict[str, Any] = {}
    if cfg.world_size is None:
        # Under torchrun, the launcher's WORLD_SIZE is the run's world size.
        launched = launched_world_size()
        updates["world_size"] = launched or 1
        gpus = machine_device_count()
        if gpus > 1 and not given and launched is None:
            logger.warning(
                "this machine has %d GPUs; areno trains on one unless you pass --world-size "
                "(e.g. --world-size %d)",
                gpus,
                gpus,
            )
    if cfg.tp_size is None:
        updates["tp_size"] = 1
    return cfg.replace(**updates) if updates else cfg


# Capabilities that are declared in the CLI but not built yet. Each entry names the option,
# a predicate on the config, and why.
_NOT_YET: list[tuple[str, Any, str]] = []


def check_available(cfg: RunConfig) -> None:
    """Fail clearly on options whose capability is not available in this build or machine."""
    if cfg.lora_rank is not None:
        check_peft_available()
    for name, predicate, what in _NOT_YET:
        if predicate(cfg):
            raise NotAvailableError(
                f"--{name.replace('_', '-')}: {what} is not available yet in areno "
                f"{_version()}; run without it"
            )


def _version() -> str:

    return __version__

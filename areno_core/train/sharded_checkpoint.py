"""Sharded checkpoints: torch.distributed.checkpoint for resuming, plus one Hugging Face export.

A checkpoint written by the distributed backend has the layout of every areno checkpoint
(``docs/checkpoints.md``), plus a ``sharded/`` folder::

    step_200/
      config.json, model.safetensors, tokenizer files   # the full policy, from_pretrained loads it
      critic/                  # the full critic (PPO)
      sharded/                 # torch.distributed.checkpoint: every rank's shards of the policy,
        .metadata, __0_0.distcp, ...   # the critic and their optimizer states
      trainer_state.pt         # scheduler, RNG states, step, data position (no optimizer)
      config.yaml
      areno_checkpoint.json    # manifest, written last: lists every file, shards included

Every rank writes its own shards into the same temporary folder; rank 0 writes the export and
the manifest and renames the folder into place, so a checkpoint is complete or absent. The
save path must be on a file system every node sees.

Resuming reads ``sharded/`` with torch.distributed.checkpoint, which reshards to any world
size: a run saved with 2 processes resumes with 1 (even by the local backend, without a process
group) or with 4. A checkpoint of the local backend (full weights and optimizer state) resumes
on any number of processes too.
"""

from __future__ import annotations

import secrets
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from safetensors.torch import load_file
from torch import nn

from areno_core.errors import ConfigError
from areno_core.log import get_logger
from areno_core.models.lora import (
    ADAPTER_WEIGHTS_FILE,
    MERGED_DIR,
    PEFT_PREFIX,
    AdapterWeights,
    save_merged,
)
from areno_core.train.checkpoint import (
    CONFIG_FILE,
    FORMAT_VERSION,
    TEMP_PREFIX,
    TRAINER_STATE_FILE,
    _fsync_tree,
    _move_into_place,
    _plain,
    _remove_stale_temps,
    _save_module,
    _write_latest,
    _write_manifest,
    _yaml_ready,
    capture_rng_state,
    load_module_weights,
    missing_files,
    read_weights,
    restore_rng_state,
)
from areno_core.train.dtensor import is_sharded, materialise

logger = get_logger(__name__)

SHARDED_DIR = "sharded"
CRITIC_DIR = "critic"


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether the checkpoint at ``path`` keeps its training state in ``sharded/``."""
    return (Path(path) / SHARDED_DIR / ".metadata").is_file()


def _roles(model: Any) -> dict[str, tuple[nn.Module, torch.optim.Optimizer | None]]:
    roles: dict[str, tuple[nn.Module, torch.optim.Optimizer | None]] = {
        "policy": (model.policy, model.optimizer)
    }
    if model.critic is not None:
        roles[CRITIC_DIR] = (model.critic, model.critic_optimizer)
    return roles


def _state_options(model: Any, name: str) -> Any:
    """How a role's weights are saved and restored: a LoRA policy's trainable (adapter)
    weights only; its frozen base comes from ``--ckpt`` again when a run resumes."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,  # heavy: distributed work only
    )

    if name == "policy" and getattr(model, "adapter", None) is not None:
        return StateDictOptions(ignore_frozen_params=True, strict=False)
    return StateDictOptions()


def _training_state(model: Any) -> dict[str, Any]:
    """What ``sharded/`` holds: each role's weights and optimizer state, keyed by name."""
    from torch.distributed.checkpoint.state_dict import (  # heavy: distributed work only
        get_model_state_dict,
        get_state_dict,
    )

    state: dict[str, Any] = {}
    for name, (module, optimizer) in _roles(model).items():
        options = _state_options(model, name)
        if optimizer is None:
            state[name] = get_model_state_dict(module, options=options)
        else:
            state[name], state[f"{name}_optimizer"] = get_state_dict(
                module, optimizer, options=options
            )
        if options.ignore_frozen_params:
            # A tied weight (the output layer sharing the embeddings) keeps its second name
            # in the state dict even when frozen; only trainable weights are kept.
            trainable = {
                key
                for key, param in module.named_parameters(remove_duplicate=False)
                if param.requires_grad
            }
            state[name] = {k: v for k, v in state[name].items() if k in trainable}
    return state


def save_sharded_checkpoint(
    ctx: Any,
    model: Any,
    save_root: str | Path,
    *,
    trainer_state: Mapping[str, Any],
    config: Mapping[str, Any],
    skeletons: Mapping[str, nn.Module],
) -> Path:
    """Write ``<save_root>/step_<model.step>/`` from every rank (a collective; see the module
    docstring). ``skeletons`` maps ``policy`` (and ``critic``) to a meta-device copy of the
    unsharded module, into which rank 0 loads the gathered weights for the export."""
    import torch.distributed.checkpoint as dcp  # heavy: distributed work only
    from torch.distributed.checkpoint.state_dict import (  # heavy: distributed work only
        StateDictOptions,
        get_model_state_dict,
    )

    step = model.step
    root = Path(save_root)
    final = root / f"step_{step}"
    tmp_name = None
    if ctx.is_main:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(root)
        tmp_name = f"{TEMP_PREFIX}{final.name}-{secrets.token_hex(4)}"
        (root / tmp_name).mkdir()
    tmp = root / ctx.broadcast_object(tmp_name)
    try:
        dcp.save(_training_state(model), checkpoint_id=str(tmp / SHARDED_DIR))
        exports: list[str] = []
        for name, (module, _) in _roles(model).items():
            adapter = model.adapter if name == "policy" else None
            # A LoRA policy is exported as its adapter: only the adapter's weights are
            # gathered, unless a merged model is asked for too.
            full_options = StateDictOptions(
                full_state_dict=True,
                cpu_offload=True,
                ignore_frozen_params=adapter is not None and not adapter.settings.save_merged,
            )
            weights = get_model_state_dict(module, options=full_options)  # rank 0 gets them
            if ctx.is_main:
                directory = tmp if name == "policy" else tmp / name
                if adapter is None:
                    _export(skeletons[name], weights, directory)
                else:
                    exports += _export_adapter(
                        adapter, skeletons[name], weights, directory, model.tokenizer
                    )
            del weights
        if ctx.is_main:
            if model.tokenizer is not None:
                model.tokenizer.save_pretrained(str(tmp))
            _write_trainer_state(ctx, model, tmp, trainer_state)
            text = yaml.safe_dump(_yaml_ready(_plain(dict(config), "config")), sort_keys=False)
            (tmp / CONFIG_FILE).write_text(text)
        ctx.barrier()  # every rank's shards are on disk
        if ctx.is_main:
            extras = [CRITIC_DIR] if model.critic is not None else []
            _write_manifest(tmp, step=step, extra_names=extras, export_names=exports)
            _fsync_tree(tmp)
            _move_into_place(tmp, final)
            _write_latest(root, final.name)
            logger.info("saved checkpoint %s", final)
    except BaseException:
        if ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    ctx.barrier()  # nobody goes on before the checkpoint is in place
    return final


def _export(skeleton: nn.Module, weights: dict[str, torch.Tensor], directory: Path) -> None:
    """Save full ``weights`` in the Hugging Face layout of the module ``skeleton`` describes."""
    _save_module(materialise(skeleton, "cpu", weights), directory)


def _export_adapter(
    adapter: Any,
    skeleton: nn.Module,
    weights: dict[str, torch.Tensor],
    directory: Path,
    tokenizer: Any,
) -> list[str]:
    """Save a LoRA policy from its gathered ``weights``: the adapter in PEFT's format and,
    with ``--save-merged``, ``merged/`` (``weights`` then hold the base weights too). Returns
    the export directories written."""

    tensors = adapter.adapter_state_dict(weights)
    config = {**adapter.adapter_config(), "inference_mode": True}  # as PEFT saves it
    AdapterWeights(config, tensors, adapter.base).save(directory)
    if not adapter.settings.save_merged:
        return []
    save_merged(materialise(skeleton, "cpu", weights), directory / MERGED_DIR, tokenizer)
    return [MERGED_DIR]


def _write_trainer_state(
    ctx: Any, model: Any, directory: Path, trainer_state: Mapping[str, Any]
) -> None:
    state = {
        "format_version": FORMAT_VERSION,
        "step": int(model.step),
        "trainer_state": _plain(
            {**trainer_state, "optimizer_steps": model.optimizer_steps}, "trainer_state"
        ),
        "optimizer": None,
        "scheduler": model.scheduler.state_dict() if model.scheduler is not None else None,
        "rng": capture_rng_state(_generators(model)),
        "extra": (
            {CRITIC_DIR: {"optimizer": None, "scheduler": None}} if model.critic is not None else {}
        ),
        "sharded": {
            "dir": SHARDED_DIR,
            "world_size": ctx.world_size,
            "tp_size": ctx.tp_size,
            "dp_replicate": ctx.replicate_size,
            "roles": sorted(_roles(model)),
        },
    }
    torch.save(state, directory / TRAINER_STATE_FILE)


def _generators(model: Any) -> dict[str, torch.Generator]:
    return {"data": model.generator, "rollout": model.rollout_generator}


# -- load ---------------------------------------------------------------------------------


def load_training_checkpoint(model: Any, path: str | Path) -> dict[str, Any]:
    """Restore a checkpoint into ``model`` (its policy and critic sharded or not, with their
    optimizers already built) and return its trainer state with ``step``; also sets
    ``model.step`` and ``model.optimizer_steps``.

    Reads a sharded checkpoint through torch.distributed.checkpoint (any world size, or none)
    and a local backend's checkpoint from its full weights and optimizer state.
    """
    path = Path(path)
    problems = missing_files(path)
    if problems:
        raise ConfigError(f"{path} is not a complete areno checkpoint: {problems[0]}")
    state = torch.load(path / TRAINER_STATE_FILE, map_location="cpu", weights_only=True)
    if state.get("format_version") != FORMAT_VERSION:
        raise ConfigError(
            f"{path}: checkpoint format version {state.get('format_version')!r} is not "
            f"supported (this areno reads version {FORMAT_VERSION})"
        )
    roles = _roles(model)
    saved = set(state.get("sharded", {}).get("roles", ["policy", *state.get("extra", {})]))
    for name in roles:
        if name not in saved:
            raise ConfigError(f"{path} has no {name!r} model; it holds {sorted(saved)}")
    if "sharded" in state:
        _load_sharded(model, path / state["sharded"]["dir"])
    else:
        _load_full(model, path, state)
    if model.scheduler is not None:
        if state.get("scheduler") is None:
            raise ConfigError(f"{path} holds no scheduler state to restore")
        model.scheduler.load_state_dict(state["scheduler"])
    restore_rng_state(state["rng"], _generators(model))
    result = dict(state["trainer_state"])
    result["step"] = state["step"]
    model.step = int(state["step"])
    model.optimizer_steps = int(result.get("optimizer_steps", 0))
    logger.info("resumed from %s (step %d)", path, state["step"])
    return result


def _load_sharded(model: Any, directory: Path) -> None:
    import torch.distributed.checkpoint as dcp  # heavy: distributed work only
    from torch.distributed.checkpoint.state_dict import (  # heavy: distributed work only
        set_model_state_dict,
        set_state_dict,
    )

    target = _training_state(model)
    with warnings.catch_warnings():  # alone, without a process group, is what is meant here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(target, checkpoint_id=str(directory), no_dist=not dist.is_initialized())
    for name, (module, optimizer) in _roles(model).items():
        options = _state_options(model, name)
        if optimizer is None:
            set_model_state_dict(module, target[name], options=options)
        else:
            set_state_dict(
                module,
                optimizer,
                model_state_dict=target[name],
                optim_state_dict=target[f"{name}_optimizer"],
                options=options,
            )


def _load_full(model: Any, path: Path, state: Mapping[str, Any]) -> None:
    """A local backend's checkpoint (full weights, index-keyed optimizer state)."""
    for name, (module, optimizer) in _roles(model).items():
        directory = path if name == "policy" else path / name
        saved_optim = state["optimizer"] if name == "policy" else state["extra"][name]["optimizer"]
        if optimizer is not None and saved_optim is None:
            raise ConfigError(f"{path} holds no optimizer state for the {name}")
        adapter = model.adapter if name == "policy" else None
        if not is_sharded(module):
            if adapter is not None:
                adapter.load(directory)
            else:
                load_module_weights(module, directory)
            if optimizer is not None:
                optimizer.load_state_dict(saved_optim)
            continue
        if adapter is not None:
            weights, strict = _saved_adapter_weights(module, directory), False
        else:
            weights, strict = read_weights(directory), True
        _load_full_into_sharded(
            module, optimizer, weights, saved_optim, strict=strict, where=directory
        )


def _saved_adapter_weights(module: nn.Module, directory: Path) -> dict[str, torch.Tensor]:
    """A saved LoRA adapter (PEFT's file) under the names of ``module``'s own parameters
    (``...q_proj.lora_A.weight`` -> ``...q_proj.lora_A.default.weight``); every trainable
    parameter of ``module`` must be among them."""

    path = directory / ADAPTER_WEIGHTS_FILE
    if not path.is_file():
        raise ConfigError(
            f"{directory} holds no LoRA adapter ({ADAPTER_WEIGHTS_FILE} is missing); it was "
            "saved by a run without --lora-rank"
        )
    weights: dict[str, torch.Tensor] = {}
    for key, tensor in load_file(str(path), device="cpu").items():
        head, _, rest = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        part, _, param = rest.partition(".")
        weights[f"{head}.lora_{part}.default.{param}"] = tensor
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    if set(weights) != trainable:
        odd = sorted(set(weights) ^ trainable)
        raise ConfigError(
            f"{directory}: the adapter does not match this model's LoRA layers (e.g. "
            f"{', '.join(odd[:3])}); resume with the saved run's --lora-* options"
        )
    return weights


def _load_full_into_sharded(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    weights: dict[str, torch.Tensor],
    saved_optim: Mapping[str, Any] | None,
    *,
    strict: bool,
    where: Path,
) -> None:
    """Full ``weights`` (all of them, or with ``strict`` False the adapter's only) and an
    index-keyed optimizer state into a sharded ``module`` and its ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )  # heavy: distributed work only

    convert = getattr(module, "convert_saved_weights", None)
    if convert is not None:
        weights = convert(weights)
    current = module.state_dict(keep_vars=True)  # tied parameters: the same object
    for key in current if strict else ():
        if key not in weights:  # a tied parameter stored once
            partner = next(
                (k for k, v in current.items() if v is current[key] and k in weights), None
            )
            if partner is None:
                raise ConfigError(f"{where}: weights do not match the model: missing {key}")
            weights[key] = weights[partner]
    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(module, weights, options=options)
    if optimizer is not None and saved_optim is not None:
        names = {id(p): n for n, p in module.named_parameters()}
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        by_name = {
            "state": {order[int(i)]: s for i, s in saved_optim["state"].items()},
            "param_groups": [
                {
                    **{k: v for k, v in group.items() if k != "params"},
                    "params": [order[int(i)] for i in group["params"]],
                }
                for group in saved_optim["param_groups"]
            ],
        }
        set_optimizer_state_dict(module, optimizer, by_name, options=options)

"""``DistributedBackend``: data parallel (FSDP2) and tensor parallel training over processes.

Every process runs the same loop on the same global batch (the data order, the optimizer
steps and the loss normalisers are those of one process); the backend shares the work:

* the policy, the reference and the critic are split over the ``(dp, tp)`` device mesh
  (:mod:`~areno_core.train.distributed.parallelize`);
* each data-parallel rank runs its share of every optimizer step's forward and backward
  passes, and the ranks' gradients are summed (:mod:`~areno_core.train.distributed.placement`),
  through the same per-step code as :class:`~areno_core.train.local.LocalBackend`;
* each process samples a block of each step's prompts from a full copy of the policy, kept
  current through ``sync_weights`` (:meth:`DistributedBackend.rollout_placement`);
* checkpoints are sharded, plus one Hugging Face export
  (:mod:`~areno_core.train.sharded_checkpoint`).

Only rank 0 prints, logs metrics and writes run outputs. CPUs use gloo, GPUs NCCL, through the
same code. See ``docs/distributed.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch import nn

from areno_core.algorithm import AlgorithmSpec
from areno_core.config import default_of
from areno_core.contracts.backend import SETUP_KEYWORDS
from areno_core.log import get_logger
from areno_core.models.compat import enable_activation_checkpointing, is_activation_checkpointing
from areno_core.rollout.placement import RolloutPlacement
from areno_core.train.checkpointing import resolve_activation_checkpointing
from areno_core.train.distributed.context import (
    DistContext,
    init_distributed,
)
from areno_core.train.distributed.parallelize import copy_full_weights, shard_module
from areno_core.train.distributed.placement import DataParallelPlacement
from areno_core.train.dtensor import is_sharded, materialise, meta_copy
from areno_core.train.local import LocalBackend
from areno_core.train.sharded_checkpoint import load_training_checkpoint, save_sharded_checkpoint
from areno_core.types import TrainResult

if TYPE_CHECKING:
    from areno_core.model import TrainableModel
    from areno_core.registry import Registry
    from areno_core.train.distributed.spec import DistributedBackendConfig

logger = get_logger(__name__)


class DistributedBackend:
    """Trains over the processes of a distributed run (see the module docstring).

    ``ctx`` is this process's place in the run (:func:`init_distributed`); ``registry`` looks
    algorithms up by name. Every process must make the same calls in the same order.
    """

    def __init__(
        self,
        ctx: DistContext,
        *,
        mixed_precision: bool = True,
        registry: Registry | None = None,
    ) -> None:
        self.ctx = ctx
        self.device = str(ctx.device)
        self.is_main_process = ctx.is_main
        self.mixed_precision = mixed_precision
        # Prompts are never shared between rows here: prefix sharing makes the number of
        # forward calls depend on the rows, and every rank must make the same calls.
        self._local = LocalBackend(
            device=self.device,
            share_prefix=False,
            registry=registry,
            placement=DataParallelPlacement(ctx),
        )
        self._skeletons: dict[str, nn.Module] = {}
        self._given_reference: bool | None = None
        self._own_reference: nn.Module | None = None
        self._replica: nn.Module | None = None

    def algorithm(self, algorithm: str | AlgorithmSpec) -> AlgorithmSpec:
        return self._local.algorithm(algorithm)

    # -- setup -----------------------------------------------------------------------------

    def setup(self, model: TrainableModel, spec: AlgorithmSpec, **optimizer: Any) -> None:
        """Shard the policy and the roles ``spec`` uses over the mesh, then build optimizers
        and schedulers over the shards (the settings of ``LocalBackend.setup``)."""
        if not is_sharded(model.policy):
            # Every process must checkpoint alike (recomputation repeats FSDP2's gathers), so
            # ``auto``, decided on each process's own free memory, is agreed: on if any says on.
            setting = optimizer.get(
                "activation_checkpointing", default_of("activation_checkpointing")
            )
            choice = resolve_activation_checkpointing(
                setting,
                model.policy,
                rows=default_of("mini_bs"),
                seq_len=default_of("max_prompt_tokens") + default_of("max_new_tokens"),
                device=self.device,
                world_size=self.ctx.world_size,
                tp_size=self.ctx.tp_size,
            )
            optimizer["activation_checkpointing"] = self.ctx.any_rank(choice)
        self._shard_roles(
            model,
            spec,
            activation_checkpointing=bool(optimizer.get("activation_checkpointing")),
        )
        self._local.setup(model, spec, **optimizer)

    def _shard_roles(
        self, model: TrainableModel, spec: AlgorithmSpec, *, activation_checkpointing: bool
    ) -> None:
        if self._given_reference is None:
            self._given_reference = model.reference is not None
        if not is_sharded(model.policy):
            if activation_checkpointing and not is_activation_checkpointing(model.policy):
                enable_activation_checkpointing(model.policy)
            self._skeletons["policy"] = meta_copy(model.policy)
        # The run asks for an optional reference only after setup (when it resumes), so one
        # is made now whenever the algorithm can use it; ``train`` hides it when unused. A
        # LoRA policy needs none: its reference is itself with the adapters off.
        if (
            spec.accepts("reference")
            and model.adapter is None
            and model.reference is None
            and self._own_reference is None
            and not self._given_reference
        ):
            model.reference = self._frozen_copy(model)
            self._own_reference = model.reference
        if not is_sharded(model.policy):
            shard_module(model.policy, self.ctx, mixed_precision=self.mixed_precision)
        if model.reference is not None and not is_sharded(model.reference):
            model.reference.eval()
            model.reference.requires_grad_(False)
            shard_module(model.reference, self.ctx, mixed_precision=self.mixed_precision)
        if "critic" in spec.roles:
            critic = model.ensure_critic()
            if not is_sharded(critic):
                if activation_checkpointing and not is_activation_checkpointing(critic):
                    enable_activation_checkpointing(critic)
                self._skeletons["critic"] = meta_copy(critic)
                shard_module(critic, self.ctx, mixed_precision=self.mixed_precision)

    def _frozen_copy(self, model: TrainableModel) -> nn.Module:
        """A frozen copy of the policy as it is now, made from its full weights."""
        if model.step > 0:
            logger.warning(
                "no reference model was given; using a frozen copy of the policy as it is now "
                "(after %d steps), not the initial policy",
                model.step,
            )
        copy = materialise(self._skeletons["policy"], self.ctx.device)
        if is_sharded(model.policy):
            copy_full_weights(model.policy, copy)
        else:
            with torch.no_grad():
                copy.load_state_dict(model.policy.state_dict())
        copy.eval()
        copy.requires_grad_(False)
        return copy

    def _use_reference(self, model: TrainableModel, spec: AlgorithmSpec, config: Any) -> None:
        """Show the backend's own reference to this step only if its config uses one."""
        if self._given_reference or self._own_reference is None:
            return
        model.reference = self._own_reference if spec.uses_reference(config) else None

    # -- training --------------------------------------------------------------------------

    def train(
        self,
        model: TrainableModel,
        data: Sequence[Any],
        *,
        algorithm: str | AlgorithmSpec = default_of("algo"),
        **options: Any,
    ) -> TrainResult:
        """One trainer step on the global batch ``data`` (the same on every process); the
        keyword arguments of :meth:`LocalBackend.train`."""
        spec = self.algorithm(algorithm)
        self.setup(model, spec, **{k: options[k] for k in SETUP_KEYWORDS if k in options})
        self._use_reference(model, spec, _algorithm_config(spec, options))
        return self._local.train(model, data, algorithm=spec, **options)

    def evaluate(
        self,
        model: TrainableModel,
        rows: Sequence[Mapping[str, Any]],
        *,
        algorithm: str | AlgorithmSpec,
        **options: Any,
    ) -> dict[str, float]:
        """Held-out loss statistics over all processes (see :meth:`LocalBackend.evaluate`)."""
        spec = self.algorithm(algorithm)
        if spec.kind != "online" and is_sharded(model.policy):
            # A reference, if this algorithm needs one, must come from the sharded policy;
            # an unsharded model is evaluated as it is (each process its share of the rows).
            self._shard_roles(model, spec, activation_checkpointing=False)
            self._use_reference(model, spec, _algorithm_config(spec, options))
        return self._local.evaluate(model, rows, algorithm=spec, **options)

    # -- rollouts --------------------------------------------------------------------------

    def rollout_placement(self, model: TrainableModel) -> RolloutPlacement:
        """Rollouts sample from a full, unsharded copy of the policy in every process, each
        process a block of the prompts; ``weights()`` refreshes the copy from the shards."""

        if "policy" not in self._skeletons:
            raise RuntimeError("rollout_placement() needs setup() first (the policy is unsharded)")
        if self._replica is None:
            self._replica = materialise(self._skeletons["policy"], self.ctx.device)
            self._replica.eval()
            self._replica.requires_grad_(False)
        replica = self._replica

        def weights() -> nn.Module:
            copy_full_weights(model.policy, replica)
            return replica

        return RolloutPlacement(
            policy=replica,
            weights=weights,
            rank=self.ctx.rank,
            size=self.ctx.world_size,
            gather=self.ctx.all_gather_objects,
        )

    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` holds in any process: the run asks it before each step whether
        to stop (Ctrl-C), so that every process stops after the same step."""
        return self.ctx.any_rank(flag)

    def model_dtype(self, choice: str) -> torch.dtype:
        """The dtype to load models in for ``--dtype choice``: always float32 (FSDP2's mixed
        precision, not the parameters' dtype, makes GPU passes bfloat16)."""
        if choice not in ("auto", "float32"):
            raise ValueError(f"--dtype {choice}: the distributed backend keeps float32 parameters")
        return torch.float32

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(
        self,
        model: TrainableModel,
        save_root: str | Path,
        *,
        trainer_state: Mapping[str, Any],
        config: Mapping[str, Any],
    ) -> Path:
        """Write ``<save_root>/step_<model.step>/`` from every process: sharded training state
        and one Hugging Face export (see :mod:`areno_core.train.sharded_checkpoint`)."""

        if "policy" not in self._skeletons:
            raise RuntimeError("save_checkpoint() needs setup() first")
        return save_sharded_checkpoint(
            self.ctx,
            model,
            save_root,
            trainer_state=trainer_state,
            config=config,
            skeletons=self._skeletons,
        )

    def load_checkpoint(self, model: TrainableModel, path: str | Path) -> dict[str, Any]:
        """Restore a checkpoint of any world size (or of the local backend) into the sharded
        model; call :meth:`setup` first."""

        if model.optimizer is None:
            raise RuntimeError("load_checkpoint() needs setup() first (the optimizers)")
        return load_training_checkpoint(model, path)


def _algorithm_config(spec: AlgorithmSpec, options: Mapping[str, Any]) -> Any:
    fields = {f.name for f in attrs.fields(spec.config_cls)}
    return spec.make_config({k: v for k, v in options.items() if k in fields})


def create_backend(
    config: Any, options: DistributedBackendConfig, registry: Registry
) -> DistributedBackend:
    """The backend of this process of a ``--backend distributed`` run (the registry's factory,
    :data:`areno_core.train.distributed.spec.DISTRIBUTED_BACKEND`)."""
    ctx = init_distributed(
        world_size=config.world_size,
        tp_size=config.tp_size,
        timeout_s=options.dist_timeout_s,
        replicate=options.dp_replicate,
    )
    _quiet_logs(ctx.is_main)
    return DistributedBackend(ctx, mixed_precision=options.fsdp_mixed_precision, registry=registry)


def _quiet_logs(main: bool) -> None:
    """Ranks other than 0 log errors only (rank 0 speaks for the run); torch's notes on how
    tensor-parallel tensors are gathered are kept out of everyone's output."""

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    if not main:
        logging.getLogger("areno").setLevel(logging.ERROR)


__all__ = [
    "DistributedBackend",
    "create_backend",
    "init_distributed",
]

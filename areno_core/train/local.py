"""``LocalBackend``: trains in this process, on the CPU or one GPU.

    model = TrainableModel.from_ckpt("random:qwen3-tiny")
    backend = LocalBackend()
    result = backend.train(model, rows, algorithm="sft", learning_rate=1e-4)

``train`` takes typed keyword arguments whose defaults are the ``areno train`` defaults (one
source: :func:`areno_core.config.default_of`); anything it does not support is a ``TypeError``
at the call site, never silently ignored. Algorithm options (for example ``grpo_clip_eps``) are
checked against the algorithm's own config class.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import torch

from areno_core.accel.attention import sdpa_without_cudnn
from areno_core.accel.precision import resolve_run_dtype
from areno_core.algorithm import AlgorithmSpec
from areno_core.config import default_of
from areno_core.log import get_logger
from areno_core.model import TrainableModel
from areno_core.models.compat import enable_activation_checkpointing, is_activation_checkpointing
from areno_core.models.lora import checkpoint_exports
from areno_core.registry import get_registry
from areno_core.rollout.placement import RolloutPlacement
from areno_core.train.batching import (
    collate,
    select_rows,
    sort_by_length,
)
from areno_core.train.checkpoint import load_checkpoint, save_checkpoint
from areno_core.train.checkpointing import resolve_activation_checkpointing
from areno_core.train.featurize import preference_trajectories, sft_trajectories
from areno_core.train.offpolicy import (
    PROXIMAL_MODES,
)
from areno_core.train.optim import build_optimizer, build_scheduler
from areno_core.train.placement import SingleProcess, UpdatePlacement, padded_passes
from areno_core.train.sharded_checkpoint import (
    is_sharded_checkpoint,
    load_training_checkpoint,
)
from areno_core.train.update import Prepared, Updater, merge_stats, score_plan, to_device
from areno_core.types import TrainResult, TrajectoryGroup

if TYPE_CHECKING:
    from areno_core.registry import Registry

logger = get_logger(__name__)

# Device types whose auto ``packed_forward`` is the packed forward (see LocalBackend._packed).
PACKED_BY_DEFAULT = frozenset({"cpu", "cuda"})


class LocalBackend:
    """Trains in this process, on CPU or one GPU (see the module docstring).

    ``share_prefix``, ``packed_forward``: see
    :class:`~areno_core.train.local_spec.LocalBackendConfig`. ``registry`` looks up algorithms
    by name (default: the process-wide registry of installed plugins). ``placement``
    decides which process runs which passes of a step (default: all of them here; the
    distributed backend passes its data-parallel placement, see
    :mod:`areno_core.train.placement`).
    """

    is_main_process = True

    def __init__(
        self,
        *,
        device: str | None = None,
        share_prefix: bool = True,
        packed_forward: bool | None = None,
        registry: Registry | None = None,
        placement: UpdatePlacement | None = None,
    ) -> None:
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.share_prefix = share_prefix
        self.packed_forward = packed_forward
        self._registry = registry
        self.placement: UpdatePlacement = placement or SingleProcess()
        # The auto decision per policy module (weakly held: a model that is gone is forgotten).
        self._auto_checkpointing: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    def _checkpointing(
        self, model: TrainableModel, setting: bool | None, *, rows: int, seq_len: int
    ) -> bool:
        """``setting``, or the ``auto`` decision, made once per policy (see
        :mod:`areno_core.train.checkpointing`)."""
        if setting is None:
            policy = model.policy
            if policy not in self._auto_checkpointing:
                self._auto_checkpointing[policy] = resolve_activation_checkpointing(
                    None, policy, rows=rows, seq_len=seq_len, device=self.device
                )
            setting = self._auto_checkpointing[policy]
        return bool(setting)

    @property
    def _updater(self) -> Updater:
        return Updater(self.placement, self.share_prefix, self._packed())

    def _packed(self) -> bool:
        """``packed_forward``, or for ``None`` (auto): packed on the devices where it was
        measured as fast or faster than the padded forward (docs/performance.md):

        * a CPU, on every measured shape (GRPO, SFT; 4x less CPU time on the GSM8K GRPO shape
          with activation checkpointing on, where only it still shares prompts);
        * a CUDA GPU: on an H200 with a Qwen3-0.6B-shaped model in bfloat16, one GRPO
          microbatch's forward and backward took 0.78x the padded forward's time with 0.69x
          its peak memory, and 1.06x the time with 0.37x the memory under activation
          checkpointing; whole GRPO steps took the same time (docs/gpu.md).

        Other devices (MPS, XPU) keep the padded forward until it is measured there."""
        if self.packed_forward is not None:
            return self.packed_forward
        return torch.device(self.device).type in PACKED_BY_DEFAULT

    def algorithm(self, algorithm: str | AlgorithmSpec) -> AlgorithmSpec:
        """The spec of ``algorithm`` (a registered name, or a spec used as it is)."""
        if isinstance(algorithm, AlgorithmSpec):
            return algorithm
        if self._registry is None:
            self._registry = get_registry()
        return self._registry.algorithm(algorithm)

    def train(
        self,
        model: TrainableModel,
        data: Sequence[TrajectoryGroup] | Sequence[Mapping[str, Any]],
        *,
        algorithm: str | AlgorithmSpec = default_of("algo"),
        learning_rate: float = default_of("lr"),
        min_lr: float = default_of("min_lr"),
        lr_decay_steps: int = default_of("lr_decay_steps"),
        lr_decay_style: Literal["cosine", "linear", "constant"] = default_of("lr_decay_style"),
        adam_betas: tuple[float, float] = (default_of("adam_beta1"), default_of("adam_beta2")),
        weight_decay: float = default_of("weight_decay"),
        adam_8bit: bool = default_of("adam_8bit"),
        grad_clip_norm: float = default_of("grad_clip_norm"),
        mini_bs: int = default_of("mini_bs"),
        gradient_accumulation_steps: int | None = default_of("gradient_accumulation_steps"),
        activation_checkpointing: bool | None = default_of("activation_checkpointing"),
        temperature: float = default_of("temperature"),
        max_prompt_tokens: int = default_of("max_prompt_tokens"),
        max_new_tokens: int = default_of("max_new_tokens"),
        disable_thinking: bool = default_of("disable_thinking"),
        critic_lr: float = default_of("critic_lr"),
        critic_warmup_steps: int = default_of("critic_warmup_steps"),
        proximal_logprobs: str = default_of("proximal_logprobs"),
        **algorithm_options: Any,
    ) -> TrainResult:
        """Run one trainer step on ``data`` and return its metrics.

        ``data`` is a list of rows for supervised and preference algorithms (``prompt`` and
        ``response``, or ``prompt``/``chosen``/``rejected``) and a list of
        :class:`TrajectoryGroup` for online algorithms. The rows are shuffled, split into
        microbatches of ``mini_bs`` rows, and ``gradient_accumulation_steps`` microbatches make
        one optimizer step (default: all of them, i.e. one optimizer step per call). Several
        optimizer steps per call make the importance ratios of online algorithms move away
        from 1 within the call, so their clipping acts.

        Groups sampled by a policy older than the model's (``policy_version`` below
        ``model.optimizer_steps``) are trained with the decoupled objective when the algorithm
        declares it; ``proximal_logprobs`` (``recompute`` or ``interpolate``) says how the
        proximal policy's log-probabilities are obtained (see
        :mod:`areno_core.train.offpolicy`).
        """
        started = time.perf_counter()
        if proximal_logprobs not in PROXIMAL_MODES:
            raise ValueError(
                f"proximal_logprobs must be one of {', '.join(PROXIMAL_MODES)}, got "
                f"{proximal_logprobs!r}"
            )
        spec = self.algorithm(algorithm)
        config = _algorithm_config(spec, algorithm_options)
        prepared = self._prepare(
            model,
            data,
            spec,
            config,
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens,
            disable_thinking=disable_thinking,
        )
        activation_checkpointing = self._checkpointing(
            model,
            activation_checkpointing,
            rows=mini_bs,
            seq_len=max_prompt_tokens + max_new_tokens,
        )
        self.setup(
            model,
            spec,
            learning_rate=learning_rate,
            min_lr=min_lr,
            lr_decay_steps=lr_decay_steps,
            lr_decay_style=lr_decay_style,
            adam_betas=adam_betas,
            weight_decay=weight_decay,
            adam_8bit=adam_8bit,
            activation_checkpointing=activation_checkpointing,
            critic_lr=critic_lr,
        )
        metrics: dict[str, float] = {}
        if prepared.trajectories:
            # On a GPU the backward passes (and the forwards that activation checkpointing
            # repeats in them) keep off cuDNN attention too, not only the forwards.
            with sdpa_without_cudnn(model.device):
                metrics = self._updater.run(
                    model,
                    prepared,
                    mini_bs=mini_bs,
                    accumulation=gradient_accumulation_steps,
                    grad_clip_norm=grad_clip_norm,
                    temperature=temperature,
                    train_actor=model.step >= critic_warmup_steps or "critic" not in spec.roles,
                    proximal_logprobs=proximal_logprobs,
                )
        else:
            logger.warning("step %d: no trainable rows; nothing was updated", model.step + 1)
        model.step += 1
        metrics["train/skipped_rows"] = float(prepared.skipped)
        metrics["time/train"] = time.perf_counter() - started
        return TrainResult(step=model.step, metrics=metrics)

    @torch.no_grad()
    def evaluate(
        self,
        model: TrainableModel,
        rows: Sequence[Mapping[str, Any]],
        *,
        algorithm: str | AlgorithmSpec,
        mini_bs: int = default_of("mini_bs"),
        temperature: float = 1.0,
        max_prompt_tokens: int = default_of("max_prompt_tokens"),
        max_new_tokens: int = default_of("max_new_tokens"),
        disable_thinking: bool = default_of("disable_thinking"),
        **algorithm_options: Any,
    ) -> dict[str, float]:
        """The loss and statistics of a supervised or preference algorithm on held-out rows,
        without touching weights, optimizer or random streams.

        Returns the algorithm's ``train/*`` statistics under ``eval/`` (``eval/loss``,
        ``eval/nll`` for sft; ``eval/rewards/accuracy``, ``eval/rewards/margin``, ... for dpo),
        each averaged over all ``rows`` as if they were one optimizer step, and
        ``eval/skipped_rows``: the rows left out because their prompt is longer than
        ``max_prompt_tokens``.
        """
        spec = self.algorithm(algorithm)
        if spec.kind == "online":
            raise ValueError(
                "evaluate() computes held-out losses of supervised and preference algorithms; "
                f"{algorithm!r} is online RL (evaluate it by sampling, see "
                "areno_core.runner.evaluation)"
            )
        config = _algorithm_config(spec, algorithm_options)
        prepared = self._prepare(
            model,
            rows,
            spec,
            config,
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens=max_new_tokens,
            disable_thinking=disable_thinking,
        )
        skipped = {"eval/skipped_rows": float(prepared.skipped)}  # prompts over the limit
        if not prepared.trajectories:
            return skipped
        device = model.device
        batch = collate(prepared.trajectories, model.pad_id)
        if spec.uses_reference(config, given=model.reference is not None):
            batch["ref_logprobs"] = self._updater.reference_logprobs(
                model, batch, score_plan(batch["lengths"], mini_bs), temperature
            )
        unit = prepared.unit_rows
        everything = [list(range(batch["input_ids"].shape[0]))]
        micro_rows = max(unit, mini_bs // unit * unit)
        ordered = sort_by_length(everything, batch["lengths"], unit)[0]
        micros = [ordered[i : i + micro_rows] for i in range(0, len(ordered), micro_rows)]
        layout = self.placement.layout(micros, lambda m: m, unit, batch["lengths"])
        passes = padded_passes(layout, self.placement.rank)
        all_tokens = batch["loss_mask"].sum().clamp(min=1.0).to(device)
        all_rows = torch.tensor(float(len(ordered)), device=device)
        policy = model.policy
        was_training = policy.training
        policy.eval()
        totals: dict[str, float] = {}
        mins: dict[str, float] = {}
        maxs: dict[str, float] = {}
        loss_sum = 0.0
        try:
            for micro in passes:
                mb = to_device(select_rows(batch, micro or list(range(unit))), device)
                mb["group_loss_tokens"] = all_tokens
                mb["group_sequences"] = all_rows
                outputs = self._updater.outputs(
                    policy, mb, temperature=temperature, need_entropy=spec.needs_entropy
                )
                loss, stats = spec.loss(outputs, mb, config)
                if micro:  # an empty pass only keeps the processes in step
                    loss_sum += float(loss)
                    merge_stats(stats, totals, mins, maxs)
        finally:
            policy.train(was_training)
        losses = [loss_sum]
        self.placement.reduce_stats(totals, mins, maxs, losses)
        loss_sum = losses[0]
        metrics = {**totals, **mins, **maxs, "train/loss": loss_sum}
        return {"eval/" + key.split("/", 1)[1]: value for key, value in metrics.items()} | skipped

    # -- preparation ----------------------------------------------------------------------

    def _prepare(
        self,
        model: TrainableModel,
        data: Sequence[Any],
        spec: AlgorithmSpec,
        config: Any,
        **featurize: Any,
    ) -> Prepared:
        if spec.kind == "online":
            if data and not isinstance(data[0], TrajectoryGroup):
                raise TypeError(
                    f"algorithm {spec.name!r} trains on TrajectoryGroup objects, got "
                    f"{type(data[0]).__name__}"
                )
            trajectories = [t for g in data for t in g.trajectories]
            return Prepared(spec, config, trajectories, 1, 0)
        if data and isinstance(data[0], TrajectoryGroup):
            raise TypeError(f"algorithm {spec.name!r} trains on dataset rows, not trajectories")
        if spec.kind == "preference":
            trajectories, stats = preference_trajectories(data, model.tokenizer, **featurize)
            return Prepared(spec, config, trajectories, 2, stats.skipped_long_prompts)
        trajectories, stats = sft_trajectories(data, model.tokenizer, **featurize)
        return Prepared(spec, config, trajectories, 1, stats.skipped_long_prompts)

    def setup(
        self,
        model: TrainableModel,
        spec: AlgorithmSpec,
        *,
        learning_rate: float = default_of("lr"),
        min_lr: float = default_of("min_lr"),
        lr_decay_steps: int = default_of("lr_decay_steps"),
        lr_decay_style: str = default_of("lr_decay_style"),
        adam_betas: tuple[float, float] = (default_of("adam_beta1"), default_of("adam_beta2")),
        weight_decay: float = default_of("weight_decay"),
        adam_8bit: bool = default_of("adam_8bit"),
        activation_checkpointing: bool | None = default_of("activation_checkpointing"),
        critic_lr: float = default_of("critic_lr"),
    ) -> None:
        """Create optimizers, schedulers and roles before the first step (``train`` calls it;
        call it yourself to restore optimizer state before training, e.g. when resuming).
        ``activation_checkpointing=None`` is ``auto`` for rows of the default lengths (see
        :mod:`areno_core.train.checkpointing`)."""
        if "reference" in spec.roles:
            model.ensure_reference()
        policy = model.policy
        activation_checkpointing = self._checkpointing(
            model,
            activation_checkpointing,
            rows=default_of("mini_bs"),
            seq_len=default_of("max_prompt_tokens") + default_of("max_new_tokens"),
        )
        if activation_checkpointing and not is_activation_checkpointing(policy):
            enable_activation_checkpointing(policy)
        # The policy's and the critic's AdamW share betas and weight decay (frozen parameters
        # are left out by build_optimizer).
        adamw = functools.partial(build_optimizer, betas=adam_betas, weight_decay=weight_decay)
        if model.optimizer is None:
            model.optimizer = adamw(policy.parameters(), lr=learning_rate, adam_8bit=adam_8bit)
            model.scheduler = build_scheduler(
                model.optimizer,
                lr=learning_rate,
                min_lr=min_lr,
                decay_steps=lr_decay_steps,
                style=lr_decay_style,
            )
        settings = {
            "learning_rate": learning_rate,
            "min_lr": min_lr,
            "lr_decay_steps": lr_decay_steps,
            "lr_decay_style": lr_decay_style,
            "adam_betas": tuple(adam_betas),
            "weight_decay": weight_decay,
            "adam_8bit": adam_8bit,
        }
        if model.optimizer_settings is None:
            model.optimizer_settings = settings
        elif settings != model.optimizer_settings:
            changed = sorted(k for k in settings if settings[k] != model.optimizer_settings[k])
            raise ValueError(
                f"optimizer settings are fixed by the first train() call of a model; "
                f"{', '.join(changed)} changed (was "
                f"{', '.join(f'{k}={model.optimizer_settings[k]!r}' for k in changed)})"
            )
        if "critic" in spec.roles and model.critic_optimizer is None:
            critic = model.ensure_critic()
            model.critic_optimizer = adamw(critic.parameters(), lr=critic_lr, adam_8bit=False)

    # -- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(
        self,
        model: TrainableModel,
        save_root: str | Path,
        *,
        trainer_state: Mapping[str, Any],
        config: Mapping[str, Any],
    ) -> Path:
        """Write ``<save_root>/step_<model.step>/`` atomically (see
        :func:`areno_core.train.checkpoint.save_checkpoint`)."""

        return save_checkpoint(
            save_root,
            model.step,
            model=model.saved_policy,
            tokenizer=model.tokenizer,
            optimizer=model.optimizer,
            scheduler=model.scheduler,
            trainer_state={**trainer_state, "optimizer_steps": model.optimizer_steps},
            config=config,
            extra_models=_extra_models(model),
            generators=_generators(model),
            exports=checkpoint_exports(model),
        )

    def model_dtype(self, choice: str) -> torch.dtype:
        """``--dtype choice`` on this backend's device (``auto``: bfloat16 where the device
        computes in it well, else float32)."""
        return resolve_run_dtype(choice, self.device)

    def rollout_placement(self, model: TrainableModel) -> RolloutPlacement:
        """One process: the engine samples from the policy module itself (free syncs)."""
        return RolloutPlacement.local(model)

    def any_process(self, flag: bool) -> bool:
        """One process: ``flag`` itself."""
        return flag

    def load_checkpoint(self, model: TrainableModel, path: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler, counters and random streams of ``model``
        (call :meth:`setup` first, so the optimizers exist); return the trainer state. A
        checkpoint of the distributed backend (any world size) loads too."""

        if is_sharded_checkpoint(path):
            return load_training_checkpoint(model, path)
        state = load_checkpoint(
            path,
            model=model.saved_policy,
            optimizer=model.optimizer,
            scheduler=model.scheduler,
            extra_models=_extra_models(model),
            generators=_generators(model),
        )
        model.step = int(state["step"])
        model.optimizer_steps = int(state.get("optimizer_steps", 0))
        return state

    # -- the update -----------------------------------------------------------------------


def _extra_models(model: TrainableModel) -> dict[str, Any]:
    if model.critic is None:
        return {}
    return {"critic": (model.critic, model.critic_optimizer)}


def _generators(model: TrainableModel) -> dict[str, torch.Generator]:
    return {"data": model.generator, "rollout": model.rollout_generator}


def _algorithm_config(spec: AlgorithmSpec, options: Mapping[str, Any]) -> Any:
    valid = {f.name for f in attrs.fields(spec.config_cls)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise TypeError(
            f"LocalBackend.train() got unexpected keyword argument(s) {', '.join(unknown)} for "
            f"algorithm {spec.name!r}; its options are: {', '.join(sorted(valid)) or 'none'}"
        )
    return spec.make_config(dict(options))

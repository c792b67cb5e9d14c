"""The model a run trains: a policy and everything trained or scored with it."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from areno_core.accel.attention import attention_of
from areno_core.log import get_logger
from areno_core.metrics.logger import MetricsLogger
from areno_core.models.loading import load_model, load_model_and_tokenizer, load_value_model
from areno_core.models.lora import LoraAdapter
from areno_core.types import TrajectoryGroup

if TYPE_CHECKING:
    from areno_core.models.lora import LoraAdapter, LoraSettings

logger = get_logger(__name__)


class TrainableModel:
    """A policy and everything trained or scored with it.

    Holds the policy module and tokenizer, the optional reference and critic, optimizer and
    scheduler state (created by the backend on the first ``train`` call), the step counters and
    the random generator that orders training rows (saved in checkpoints for exact resume).

    With a LoRA ``adapter`` (:meth:`add_lora`, or ``from_ckpt(..., lora=...)``) the policy is
    the same module with adapter layers inside; only the adapters are trained, and the
    reference (when none is given) is the base model: the policy with its adapters off.
    """

    def __init__(
        self,
        policy: Any,
        tokenizer: Any,
        *,
        name: str = "policy",
        ckpt: str | None = None,
        reference: Any = None,
        critic: Any = None,
        seed: int = 0,
        metrics_dir: str | None = None,
        adapter: LoraAdapter | None = None,
    ) -> None:
        self.name = name
        self.ckpt = ckpt
        self.policy = policy
        self.tokenizer = tokenizer
        self.reference = reference
        self.critic = critic
        self.adapter = adapter
        self.step = 0
        self.optimizer_steps = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.optimizer_settings: dict[str, Any] | None = None
        self.generator = torch.Generator().manual_seed(seed)
        self.rollout_generator = torch.Generator().manual_seed(seed + 1)
        self._metrics = MetricsLogger(metrics_dir) if metrics_dir else None
        # The sinks are closed (TensorBoard's buffered events written) by close(), or when the
        # model is collected or the interpreter exits, whichever comes first: a script that
        # never calls close() still gets its last points, and no writer thread outlives the
        # model.
        self._close_metrics = (
            weakref.finalize(self, self._metrics.close) if self._metrics is not None else None
        )

    @classmethod
    def from_ckpt(
        cls,
        ckpt: str,
        *,
        ref_ckpt: str | None = None,
        critic_ckpt: str | None = None,
        device: str = "cpu",
        seed: int = 0,
        metrics_dir: str | None = None,
        name: str = "policy",
        dtype: torch.dtype | str = "auto",
        attn_implementation: str | None = None,
        lora: LoraSettings | None = None,
    ) -> TrainableModel:
        """Load a policy (and optional reference/critic) from local paths, hub ids or random:.

        ``dtype`` and ``attn_implementation`` apply to every model loaded here and to a critic
        created later by :meth:`ensure_critic` (``"auto"``: the checkpoint's stored dtype).
        With ``lora``, put LoRA adapters on the policy (see :meth:`add_lora`).
        """

        torch.manual_seed(seed)
        how = {"device": device, "dtype": dtype, "attn_implementation": attn_implementation}
        policy, tokenizer = load_model_and_tokenizer(ckpt, **how)
        reference = load_model(ref_ckpt, role="reference", **how) if ref_ckpt else None
        critic = None
        if critic_ckpt:
            critic = load_value_model(critic_ckpt, **how)
        model = cls(
            policy,
            tokenizer,
            name=name,
            ckpt=ckpt,
            reference=reference,
            critic=critic,
            seed=seed,
            metrics_dir=metrics_dir,
        )
        if lora is not None:
            model.add_lora(lora)
        return model

    def add_lora(self, settings: LoraSettings) -> LoraAdapter:
        """Put LoRA adapters on the policy (in place) and train only them from now on.

        Call it before the first ``train`` (the optimizer is built over the trainable
        weights then). The adapters start at zero, so the adapted policy equals the base.
        """

        if self.adapter is not None:
            raise ValueError("the policy already has LoRA adapters")
        if self.optimizer is not None:
            raise ValueError(
                "add_lora() must come before the first train() call: the optimizer already "
                "holds the policy's full weights"
            )
        self.adapter = LoraAdapter.attach(self.policy, settings, base=self.ckpt)
        return self.adapter

    @property
    def saved_policy(self) -> Any:
        """What a checkpoint saves and restores for the policy: the PEFT model (its adapter,
        in PEFT's format) with LoRA, else the policy module."""
        return self.adapter.peft_model if self.adapter is not None else self.policy

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point type of the policy's weights."""
        return next(self.policy.parameters()).dtype

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def ensure_reference(self) -> Any:
        """The reference model; if none was given, the base model of a LoRA policy (the
        policy with its adapters off, no copy), else a frozen copy of the current policy."""
        if self.reference is None and self.adapter is not None:
            return self.adapter.reference_view()
        if self.reference is None:
            if self.step > 0:
                logger.warning(
                    "no reference model was given; using a frozen copy of the policy as it "
                    "is now (after %d steps), not the initial policy",
                    self.step,
                )
            self.reference = copy.deepcopy(self.policy)
        self.reference.eval()
        self.reference.requires_grad_(False)
        return self.reference

    def ensure_critic(self) -> Any:
        """The critic; the policy checkpoint's backbone with a fresh value head if none given."""
        if self.critic is None:
            if self.ckpt is None:
                raise ValueError("PPO needs a critic: pass critic= or load with from_ckpt")
            # The same dtype and attention kernels as the policy.
            self.critic = load_value_model(
                self.ckpt,
                device=str(self.device),
                dtype=self.dtype,
                attn_implementation=attention_of(self.policy),
            )
        return self.critic

    def log(
        self,
        groups: Sequence[TrajectoryGroup] | None = None,
        *,
        metrics: Mapping[str, float] | None = None,
        step: int | None = None,
        split: str = "train",
    ) -> dict[str, float]:
        """Log metrics (and rollout statistics of ``groups``) explicitly; returns what it logged."""
        values: dict[str, float] = dict(metrics or {})
        if groups:
            rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float64)
            prefix = "rollout" if split == "train" else split
            values.update(
                {
                    f"{prefix}/reward_mean": float(rewards.mean()),
                    f"{prefix}/reward_std": float(rewards.std(unbiased=False)),
                    f"{prefix}/reward_min": float(rewards.min()),
                    f"{prefix}/reward_max": float(rewards.max()),
                }
            )
        if self._metrics is not None and values:
            self._metrics.log(values, step if step is not None else self.step)
        return values

    def close(self) -> None:
        """Close the metrics sinks (safe to call twice; also done when the model is collected
        or the interpreter exits)."""
        if self._close_metrics is not None:
            self._close_metrics()

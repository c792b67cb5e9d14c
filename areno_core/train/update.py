"""The update phase of a trainer step, shared by both training backends: score the batch
(reference, proximal policy, critic, advantages), then take each optimizer step over its
microbatches (forward, loss, backward; clip; step) and report the step's ``train/*``
metrics. Which process runs which microbatches is the :class:`UpdatePlacement`'s choice."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from areno_core.accel.attention import sdpa_without_cudnn
from areno_core.algorithm import AlgorithmSpec
from areno_core.model import TrainableModel
from areno_core.train.batching import (
    collate,
    padding_fraction,
    plan_steps,
    select_rows,
    sort_by_length,
    split_by_padding,
)
from areno_core.train.forward import policy_outputs, value_outputs
from areno_core.train.offpolicy import (
    interpolate_proximal,
    stale_rows,
    with_behaviour,
    with_proximal,
)
from areno_core.train.optim import gradient_tensors
from areno_core.train.placement import UpdatePlacement, padded_passes
from areno_core.types import Trajectory


@attrs.frozen
class Prepared:
    """A trainer step's rows as trajectories, with the algorithm that trains on them."""

    spec: AlgorithmSpec
    config: Any
    trajectories: list[Trajectory]
    unit_rows: int
    skipped: int


@attrs.define
class _Scored:
    """A collated batch with what the loss needs besides the policy's outputs."""

    batch: dict[str, Any]
    offpolicy: dict[str, float]
    proximal_version: int
    critic: Any
    rollout_stats: dict[str, Any]
    deferred_proximal: bool = False


@attrs.define
class _Tally:
    """The statistics of a trainer step's optimizer steps, as they are taken."""

    totals: dict[str, float] = attrs.Factory(dict)
    mins: dict[str, float] = attrs.Factory(dict)
    maxs: dict[str, float] = attrs.Factory(dict)
    grad_norms: list[float] = attrs.Factory(list)
    losses: list[float] = attrs.Factory(list)
    target_tokens: float = 0.0

    def metrics(self, n_steps: int) -> dict[str, float]:
        """Means over the optimizer steps (extremes as they are), loss and gradient norm."""
        metrics = {k: v / n_steps for k, v in self.totals.items()}
        metrics.update(self.mins)
        metrics.update(self.maxs)
        metrics["train/loss"] = sum(self.losses) / n_steps
        metrics["train/grad_norm"] = sum(self.grad_norms) / n_steps
        return metrics


@attrs.frozen
class Updater:
    """Runs update phases with one backend's forward settings (``share_prefix``,
    ``packed_forward``: see :class:`~areno_core.train.local.LocalBackendConfig`) and
    placement."""

    placement: UpdatePlacement
    share_prefix: bool = True
    packed_forward: bool = False

    def reference_logprobs(
        self,
        model: TrainableModel,
        batch: dict[str, Any],
        plan: list[list[int]],
        temperature: float,
    ) -> torch.Tensor:
        """Per-token logprobs of the frozen reference over ``batch`` ([B, T], on the CPU)."""
        return self._logprobs(model.ensure_reference(), batch, plan, model.device, temperature)

    def _logprobs(
        self,
        module: Any,
        batch: dict[str, Any],
        plan: list[list[int]],
        device: torch.device,
        temperature: float,
    ) -> torch.Tensor:
        """``module``'s per-token log-probabilities over the rows of ``plan`` (through
        :meth:`outputs`), without gradients ([B, T] on the CPU)."""
        return self.placement.score(
            batch,
            plan,
            device,
            lambda mb: self.outputs(module, mb, temperature=temperature)["logprobs"],
        )

    def outputs(
        self, model: Any, mb: dict[str, Any], *, temperature: float, need_entropy: bool = False
    ) -> dict[str, torch.Tensor]:
        """:func:`policy_outputs` with this backend's forward settings (prefix sharing,
        packing), cuDNN attention off on a GPU (:func:`sdpa_without_cudnn`)."""
        with sdpa_without_cudnn(mb["input_ids"].device):
            return policy_outputs(
                model,
                mb,
                temperature=temperature,
                need_entropy=need_entropy,
                share_prefix=self.share_prefix,
                packed=self.packed_forward,
            )

    def run(
        self,
        model: TrainableModel,
        prepared: Prepared,
        *,
        mini_bs: int,
        accumulation: int | None,
        grad_clip_norm: float,
        temperature: float,
        train_actor: bool,
        proximal_logprobs: str = "recompute",
    ) -> dict[str, float]:
        """Score the batch (reference, proximal policy, critic, advantages), then take each
        optimizer step of the trainer step over its microbatches; the step's metrics."""
        batch = collate(prepared.trajectories, model.pad_id)
        scored = self._score_batch(model, prepared, batch, mini_bs, temperature, proximal_logprobs)
        batch = scored.batch
        unit, lengths = prepared.unit_rows, batch["lengths"]
        rows = batch["input_ids"].shape[0]
        steps = plan_steps(rows // unit, unit, mini_bs, accumulation, model.generator)
        if scored.deferred_proximal:
            batch = self._finish_proximal(model, scored, steps, mini_bs, temperature)
        spec = prepared.spec
        piece_cost = _piece_cost(model.policy, model.device) if spec.kind == "supervised" else None

        def plan_passes(micros: list[list[int]]) -> list[list[int]]:
            micros = sort_by_length(micros, lengths, unit)
            if piece_cost is None:
                return micros
            return [piece for m in micros for piece in split_by_padding(m, lengths, piece_cost)]

        # Every data-parallel rank's passes of every step (one rank: all of them, here).
        layouts = [self.placement.layout(s, plan_passes, unit, lengths) for s in steps]
        model.policy.train()
        if scored.critic is not None:
            scored.critic.train()
        tally = _Tally()
        t0 = time.perf_counter()
        for step_rows, layout in zip(steps, layouts, strict=True):
            self._optimizer_step(
                model, prepared, scored, step_rows, layout, tally,
                temperature=temperature, grad_clip_norm=grad_clip_norm, train_actor=train_actor,
            )  # fmt: skip
        elapsed = time.perf_counter() - t0
        self.placement.reduce_stats(tally.totals, tally.mins, tally.maxs, tally.losses)
        passes = [p for layout in layouts for step in layout for p in step if p]
        metrics = tally.metrics(len(steps))
        metrics.update(
            {
                "train/lr": float(model.optimizer.param_groups[0]["lr"]),  # type: ignore[union-attr]
                "train/optimizer_steps": float(len(steps)),
                "train/target_tokens": tally.target_tokens,
                "train/tokens_per_s": float(lengths.sum()) / max(elapsed, 1e-9),
                "train/padding_fraction": padding_fraction(passes, lengths),
            }
        )
        if spec.kind == "online":
            metrics.update(_advantage_stats(batch))
        metrics.update({k: float(v) for k, v in scored.rollout_stats.items()})
        metrics.update(scored.offpolicy)
        return metrics

    def _score_batch(
        self,
        model: TrainableModel,
        prepared: Prepared,
        batch: dict[str, Any],
        mini_bs: int,
        temperature: float,
        proximal_logprobs: str,
    ) -> _Scored:
        """What the loss needs besides the policy's own outputs: reference and proximal
        logprobs, the critic's values, and the algorithm's advantages."""
        spec, config = prepared.spec, prepared.config
        plan = score_plan(batch["lengths"], mini_bs)
        # An optional reference is scored when the algorithm's config wants it (PPO's KL loss)
        # or when the user supplied one.
        if spec.uses_reference(config, given=model.reference is not None):
            batch["ref_logprobs"] = self.reference_logprobs(model, batch, plan, temperature)
        batch, offpolicy, deferred = self._attach_proximal(
            model, prepared, batch, plan, temperature, proximal_logprobs
        )
        proximal_version = model.optimizer_steps
        critic = model.ensure_critic() if "critic" in spec.roles else None
        if critic is not None:
            batch["values"] = self.placement.score(
                batch, plan, model.device, lambda mb: value_outputs(critic, mb)
            )
        if spec.advantages is not None:
            batch = spec.advantages(batch, config)
        rollout_stats = dict(batch.pop("rollout_stats", None) or {})
        return _Scored(batch, offpolicy, proximal_version, critic, rollout_stats, deferred)

    def _optimizer_step(
        self,
        model: TrainableModel,
        prepared: Prepared,
        scored: _Scored,
        step_rows: list[list[int]],
        layout: Any,
        tally: _Tally,
        *,
        temperature: float,
        grad_clip_norm: float,
        train_actor: bool,
    ) -> None:
        """One optimizer step: forward, loss and backward on each microbatch of this process,
        then clip the gradients and step the policy's (and the critic's) optimizer."""
        spec, config, batch, critic = prepared.spec, prepared.config, scored.batch, scored.critic
        policy, device, unit = model.policy, model.device, prepared.unit_rows
        flat = [r for micro in step_rows for r in micro]
        index = torch.tensor(flat)
        group_tokens = batch["loss_mask"][index].sum().clamp(min=1.0)
        group_rows = torch.tensor(float(len(flat)))
        tally.target_tokens += float(group_tokens)
        step_loss = torch.zeros((), dtype=torch.float64)
        for micro in padded_passes(layout, self.placement.rank):
            mb = to_device(select_rows(batch, micro or list(range(unit))), device)
            mb["group_loss_tokens"] = group_tokens.to(device)
            mb["group_sequences"] = group_rows.to(device)
            entropy = spec.needs_entropy or spec.kind == "online"
            outputs = self.outputs(policy, mb, temperature=temperature, need_entropy=entropy)
            if critic is not None:
                outputs["values"] = value_outputs(critic, mb)
            if FROM_FORWARD in mb:  # recompute, taken from this first step's own forward
                mb = proximal_from_forward(mb, outputs["logprobs"])
            if "behaviour_version" in mb:  # --proximal-logprobs interpolate
                mb = interpolate_proximal(
                    mb,
                    outputs["logprobs"],
                    proximal_version=scored.proximal_version,
                    current_version=model.optimizer_steps,
                )
            loss, stats = spec.loss(outputs, mb, config)
            if not micro:  # an empty pass only keeps the processes in step
                (loss * 0.0).backward()
                continue
            loss.backward()
            step_loss += loss.detach().double().cpu()
            merge_stats(stats, tally.totals, tally.mins, tally.maxs)
        norm = self.placement.clip_grad_norm(
            gradient_tensors(model.optimizer, policy.parameters()), grad_clip_norm
        )
        if train_actor:
            model.optimizer.step()  # type: ignore[union-attr]
            model.scheduler.step()
            model.optimizer_steps += 1
        model.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        if critic is not None:
            self.placement.clip_grad_norm(
                gradient_tensors(model.critic_optimizer, critic.parameters()),
                grad_clip_norm,
            )
            model.critic_optimizer.step()  # type: ignore[union-attr]
            model.critic_optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        tally.grad_norms.append(float(norm))
        tally.losses.append(float(step_loss))

    def _attach_proximal(
        self,
        model: TrainableModel,
        prepared: Prepared,
        batch: dict[str, Any],
        plan: list[list[int]],
        temperature: float,
        mode: str,
    ) -> tuple[dict[str, Any], dict[str, float], bool]:
        """For a decoupled algorithm and a batch with samples of an older policy: keep the
        sampler's log-probabilities as ``behaviour_logprobs`` and, with ``mode`` recompute,
        score the policy as it is now (the proximal policy) into ``old_logprobs`` (or, for an
        algorithm whose advantages do not read them, say to do so in :meth:`run` once the
        optimizer steps are known: the third value); with interpolate the update loop fills
        them per microbatch (:mod:`areno_core.train.offpolicy`). Returns the batch and, when
        the batch is stale,
        ``train/stale_rows`` (and ``time/proximal`` for recompute)."""
        spec = prepared.spec
        stale = stale_rows(prepared.trajectories, model.optimizer_steps) if spec.decoupled else 0
        if not stale:
            return batch, {}, False
        if mode == "interpolate":
            stale_metric = {"train/stale_rows": float(stale)}
            return with_behaviour(batch, prepared.trajectories), stale_metric, False
        if not spec.proximal_in_advantages:
            # Scored in run() once the optimizer steps are planned, still before the first one.
            return batch, {"train/stale_rows": float(stale)}, True
        started = time.perf_counter()
        proximal = self._score_proximal(model, batch, plan, temperature)
        metrics = {
            "train/stale_rows": float(stale),
            "time/proximal": time.perf_counter() - started,
        }
        return with_proximal(batch, proximal), metrics, False

    def _score_proximal(
        self,
        model: TrainableModel,
        batch: dict[str, Any],
        plan: list[list[int]],
        temperature: float,
    ) -> torch.Tensor:
        """The policy as it is now (the proximal policy) scored over the rows of ``plan``,
        without gradients ([B, T] on the CPU; rows outside ``plan`` stay 0), through the same
        forward as the update (:meth:`outputs`: packed where the update is packed)."""
        policy = model.policy
        was_training = policy.training
        policy.eval()
        try:
            return self._logprobs(policy, batch, plan, model.device, temperature)
        finally:
            policy.train(was_training)

    def _finish_proximal(
        self,
        model: TrainableModel,
        scored: _Scored,
        steps: list[list[list[int]]],
        mini_bs: int,
        temperature: float,
    ) -> dict[str, Any]:
        """``--proximal-logprobs recompute`` without a pass it does not need: the policy of a
        train step's first optimizer step *is* the proximal one, so that step's rows take
        their proximal log-probabilities from their own forward pass (exactly, detached);
        only the rows of later optimizer steps are scored now, before the first step. With
        the default one optimizer step per train step, nothing is scored."""
        batch = scored.batch
        first = sorted(r for micro in steps[0] for r in micro) if steps else []
        later = sorted(set(range(batch["input_ids"].shape[0])) - set(first))
        started = time.perf_counter()
        proximal = torch.zeros(batch["rollout_logprobs"].shape, dtype=torch.float32)
        if later:
            lengths = batch["lengths"][later]
            plan = [[later[i] for i in micro] for micro in score_plan(lengths, mini_bs)]
            proximal = self._score_proximal(model, batch, plan, temperature)
        batch = with_proximal(batch, proximal.to(batch["rollout_logprobs"].dtype))
        flags = torch.zeros(batch["input_ids"].shape[0], dtype=torch.bool)
        flags[first] = True
        batch[FROM_FORWARD] = flags
        scored.offpolicy["time/proximal"] = time.perf_counter() - started
        scored.offpolicy["train/proximal_rows_scored"] = float(len(later))
        scored.batch = batch
        return batch


FROM_FORWARD = "proximal_from_forward"
"""Batch key [B] bool: rows whose proximal log-probabilities are their first optimizer step's
own forward pass (see :func:`proximal_from_forward`)."""


def proximal_from_forward(microbatch: dict[str, Any], logprobs: torch.Tensor) -> dict[str, Any]:
    """``microbatch`` with the flagged rows' ``old_logprobs`` set to ``logprobs`` (this pass's,
    detached, zero outside the loss mask); the other rows keep theirs."""
    flags = microbatch[FROM_FORWARD].to(logprobs.device)[:, None]
    old = microbatch["old_logprobs"]
    mine = torch.where(microbatch["loss_mask"] > 0, logprobs.detach(), torch.zeros_like(logprobs))
    return {**microbatch, "old_logprobs": torch.where(flags, mine.to(old.dtype), old)}


_CPU_PASS_OVERHEAD_FLOPS = 2e9


def _piece_cost(model: Any, device: torch.device) -> int | None:
    """Padded tokens worth one more pass when a supervised microbatch is cut by length
    (see :func:`split_by_padding`); None on GPUs, whose kernels want whole microbatches."""
    if device.type != "cpu":
        return None
    params = sum(p.numel() for p in model.parameters())
    return max(1, int(_CPU_PASS_OVERHEAD_FLOPS / (6 * max(params, 1))))


def score_plan(lengths: torch.Tensor, mini_bs: int) -> list[list[int]]:
    order = torch.argsort(lengths).tolist()
    return [order[i : i + mini_bs] for i in range(0, len(order), mini_bs)]


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def merge_stats(
    stats: Mapping[str, Any],
    totals: dict[str, float],
    mins: dict[str, float],
    maxs: dict[str, float],
) -> None:
    """Combine per-microbatch stats: ``*_max`` by max, ``*_min`` by min, the rest by sum."""
    for key, value in stats.items():
        v = float(value)
        if key.endswith("_max"):
            maxs[key] = max(maxs.get(key, v), v)
        elif key.endswith("_min"):
            mins[key] = min(mins.get(key, v), v)
        else:
            totals[key] = totals.get(key, 0.0) + v


def _advantage_stats(batch: Mapping[str, Any]) -> dict[str, float]:
    mask = batch["loss_mask"]
    adv = batch["advantages"]
    n = mask.sum().clamp(min=1.0)
    mean = (adv * mask).sum() / n
    return {
        "train/advantage_mean": float(mean),
        "train/advantage_abs_mean": float((adv.abs() * mask).sum() / n),
    }

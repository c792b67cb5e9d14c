"""The contract between the core and an algorithm plugin.

An algorithm is data plus pure tensor functions. The core owns everything else: the loop,
microbatching, gradient accumulation, the optimizer, epochs over a rollout batch.

Shapes used below: ``B`` rows, ``T`` tokens per row. Every per-token tensor is aligned with
``input_ids``: position ``t`` describes token ``input_ids[:, t]`` (its log-probability given the
tokens before it, whether it is a trainable target, its advantage, ...). Position 0 is never a
target.

``loss(outputs, batch, config) -> (loss, stats)``
    ``outputs`` holds ``logprobs`` [B, T] of the policy being trained (and ``entropy`` [B, T],
    ``values`` [B, T] when the algorithm asked for them). ``batch`` is the microbatch dict (see
    :data:`areno_core.types.TrainBatch`) plus two float scalars describing the whole
    accumulation group the microbatch belongs to: ``group_loss_tokens`` (number of target tokens)
    and ``group_sequences`` (number of rows). A loss divides by those, not by microbatch sizes,
    so summing the losses of all microbatches of a group gives the group's mean exactly.
    ``stats`` maps names to detached scalar tensors (already weighted the same way, so the core
    sums them across microbatches).

``advantages(batch, config) -> batch``
    Online algorithms only. Receives the whole rollout batch with ``rewards`` [B] (one scalar
    per row), ``group_index`` [B] (rows sampled from the same prompt share it), ``loss_mask``,
    and, when the algorithm needs them, ``values`` / ``ref_logprobs`` / ``old_logprobs``.
    Returns the batch with ``advantages`` [B, T] (and ``returns`` [B, T] for critics) added.

Stale samples
    ``old_logprobs`` are the log-probabilities the ratio and the clip are taken against. For
    samples drawn by the policy at the start of the train step they are the sampler's own
    (``rollout_logprobs``). When some samples come from an older policy (asynchronous rollout)
    and the algorithm declares ``decoupled``, the backend recomputes ``old_logprobs`` with the
    policy at the start of the step (the proximal policy) and adds ``behaviour_logprobs``, the
    sampler's; the key's presence is the signal (docs/async.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from areno_core.options import make_options

AlgorithmKind = Literal["supervised", "preference", "online"]
Role = Literal["reference", "critic", "reward_model"]
ROLES: tuple[str, ...] = ("reference", "critic", "reward_model")
LossFn = Callable[[Mapping[str, Any], Mapping[str, Any], Any], "tuple[Any, dict[str, Any]]"]
AdvantageFn = Callable[[dict[str, Any], Any], dict[str, Any]]


@attrs.frozen
class RowSchema:
    """The keys a loader must produce for an algorithm, and the types each may have."""

    required: Mapping[str, tuple[type, ...]]
    optional: Mapping[str, tuple[type, ...]] = attrs.field(factory=dict)
    description: str = ""

    def describe(self) -> str:
        def fmt(spec: Mapping[str, tuple[type, ...]]) -> str:
            return ", ".join(f"{k} ({'|'.join(t.__name__ for t in v)})" for k, v in spec.items())

        text = f"required: {fmt(self.required)}"
        if self.optional:
            text += f"; optional: {fmt(self.optional)}"
        return text


@attrs.frozen
class AlgorithmSpec:
    """What an algorithm plugin registers.

    ``config_cls`` is an attrs class whose fields are the algorithm's own run options, declared
    with :func:`areno_core.option` (for example ``grpo_clip_eps``). It is their only
    declaration: ``areno train --help``, ``--config`` files, recipes and the generated docs are
    built from it, and the core fills each field from the resolved run.

    What the core must know about an algorithm it learns from these fields, never from its name:

    ``roles`` / ``optional_roles``
        Models besides the policy: ``reference`` (a frozen reference model), ``critic`` (a
        value model with its own optimizer) and ``reward_model`` (``--reward-ckpt`` may score
        samples). A required role is always set up; an optional one is offered.
    ``wants_reference``
        For an optional reference: a function of the algorithm's config saying whether this
        configuration uses it (PPO's KL loss). A reference the user gives is always scored.
    ``needs_groups``
        Advantages are relative to the other samples of the same prompt, so ``--n-samples``
        must be 2 or more.
    ``needs_entropy`` / ``needs_values``
        Ask the backend for per-token entropies / the critic's values.
    ``decoupled``
        The loss handles stale samples with the decoupled objective (docs/async.md): when some
        samples of a batch were drawn by a policy older than the one at the start of the train
        step, the backend scores that proximal policy into ``old_logprobs`` and adds
        ``behaviour_logprobs`` (the sampling policy's); the loss clips against the first and
        weights each token by their ratio to the second. Runs with ``--async-rollout
        --max-staleness`` above 0 need it.
    ``proximal_in_advantages``
        ``advantages`` reads ``old_logprobs`` (PPO's KL penalty in the reward), so with
        ``--proximal-logprobs recompute`` every stale row is scored by the proximal policy
        before it runs. Otherwise the rows of a train step's first optimizer step take those
        log-probabilities from their own forward pass (the policy is still the proximal one
        there) and only the rows of later optimizer steps are scored.
    """

    name: str
    summary: str
    kind: AlgorithmKind
    row_schema: RowSchema
    config_cls: type
    loss: LossFn
    advantages: AdvantageFn | None = None
    roles: frozenset[str] = frozenset()
    optional_roles: frozenset[str] = frozenset()
    wants_reference: Callable[[Any], bool] | None = None
    needs_groups: bool = False
    needs_entropy: bool = False
    needs_values: bool = False
    decoupled: bool = False
    proximal_in_advantages: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name != self.name.strip():
            raise ValueError(f"algorithm name {self.name!r} must be a non-empty word without '/'")
        if self.kind == "online" and self.advantages is None:
            raise ValueError(f"online algorithm {self.name!r} must define advantages()")
        if not attrs.has(self.config_cls):
            raise TypeError(f"algorithm {self.name!r}: config_cls must be an attrs class")
        unknown = (self.roles | self.optional_roles) - set(ROLES)
        if unknown:
            raise ValueError(
                f"algorithm {self.name!r}: unknown role(s) {sorted(unknown)}; roles are "
                f"{', '.join(ROLES)}"
            )

    @property
    def needs_rollout(self) -> bool:
        return self.kind == "online"

    def accepts(self, role: str) -> bool:
        """Whether the algorithm can use a model in ``role`` (required or optional)."""
        return role in self.roles or role in self.optional_roles

    def uses_reference(self, config: Any, *, given: bool = False) -> bool:
        """Whether a run with this algorithm config scores a reference model; ``given``: the
        user supplied one (``--ref-ckpt`` or ``TrainableModel(reference=...)``)."""
        if "reference" in self.roles:
            return True
        if "reference" not in self.optional_roles:
            return False
        return given or (self.wants_reference is not None and bool(self.wants_reference(config)))

    def make_config(self, options: Any) -> Any:
        """Build this algorithm's config from an object or mapping of run options."""

        return make_options(self.config_cls, options)

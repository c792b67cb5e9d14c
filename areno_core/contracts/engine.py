"""What every rollout engine provides, and the session that brackets a rollout phase.

A training step runs ``with RolloutSession(engine, drop_state=...)``: inside, the loop calls
``engine.generate(prompt_token_ids, sampling, n=...)``; on exit the engine either keeps its
buffers for the next step (the default, less setup per step) or frees them
(``--drop-rollout-state``, more memory for the train phase).

The lifecycle, and what ending a session may drop:

* ``end_session(drop_state=True)`` may free the KV cache, per-row buffers and captured decode
  graphs; the engine rebuilds them by itself on the next ``generate``.
* It may also free the *weights*, but only an engine that says so: ``drops_weights`` is True
  (e.g. a colocated SGLang server, whose memory saver discards the weights on release unless
  it keeps a CPU copy). Such an engine sets ``holds_weights`` to False until the next
  ``sync_weights`` and refuses to ``generate`` meanwhile (:class:`WeightsNotHeldError`): it
  never samples from memory that no longer holds the version it would stamp.
* Whoever syncs weights (the run's :class:`~areno_core.runner.rollout.RolloutRunner`, the
  asynchronous rollout worker) checks :func:`holds_weights` before each session and pushes the
  weights of the current version again when the engine lost them, so a release never changes
  what a completion's ``policy_version`` means.

An engine that never drops its weights (the native engine) needs neither attribute: one
without them is taken to hold its weights from the first ``sync_weights`` on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from areno_core.errors import ArenoError
from areno_core.options import NoOptions, check_spec_callables, make_options
from areno_core.types import Completion, SamplingParams
from areno_core.validators import boolean, number, one_of, required

AttnBackend = Literal["flash", "native"]
ATTN_BACKENDS: tuple[str, ...] = ("flash", "native")


@attrs.frozen
class EngineOptions:
    """What every rollout engine honours, from the run's core options. An engine's own
    options are its spec's ``config_cls`` (see :class:`EngineSpec`)."""

    max_running: int | None = attrs.field(
        default=None,
        validator=number(min=1, integer=True),
        metadata={
            "help": "Most sequences decoded at once (--max-running-prompts). None runs every "
            "requested sample of a generate() call together."
        },
    )
    max_prompt_tokens: int = attrs.field(
        default=1024,
        validator=[required, number(min=1, integer=True)],
        metadata={
            "help": "Prompts with more tokens are skipped: generate() returns no completion "
            "for them and counts them in stats['skipped_prompts'] (--max-prompt-tokens)."
        },
    )
    attn_backend: AttnBackend = attrs.field(
        default="flash",
        validator=[required, one_of(ATTN_BACKENDS)],
        metadata={
            "help": "Attention kernels for rollout: 'flash' needs flash-attn and a CUDA GPU "
            "and otherwise falls back to 'native' (torch SDPA) with a warning (--attn-backend)."
        },
    )
    eager_decode: bool = attrs.field(
        default=False,
        validator=boolean,
        metadata={
            "help": "Run decode steps eagerly instead of replaying a CUDA graph "
            "(--eager-decode). Matters only for engines that capture CUDA graphs."
        },
    )


@runtime_checkable
class RolloutEngine(Protocol):
    """What the run, the evaluator and the agentic endpoint call on a rollout engine.

    This is the whole contract: an engine that implements these members works everywhere.
    """

    stats: dict[str, float]
    """Counters for the current session: ``skipped_prompts``, ``generated_tokens``,
    ``generate_time_s`` and engine-specific extras."""

    policy_version: int
    """The version of the weights the engine samples from: the ``version`` of the last
    ``sync_weights`` call (0 before any). Every completion carries it."""

    def start_session(self) -> None:
        """Prepare for a rollout phase and reset ``stats``."""

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, n: int = 1
    ) -> list[list[Completion]]:
        """Sample ``n`` completions per prompt; result ``[i]`` belongs to ``prompts[i]``.

        A prompt longer than the engine's ``max_prompt_tokens`` gets an empty list. The random
        stream is ``sampling.seed`` (the run always sets one, drawn from its own generator), so
        the same call with the same seed samples the same tokens. Each completion's
        ``policy_version`` is the engine's ``policy_version``.
        """

    def sync_weights(self, weights: Mapping[str, Any] | Any, *, version: int) -> None:
        """Sample from ``weights`` from now on: the policy module, or a (possibly partial)
        state dict of it. ``version`` counts the policy's optimizer steps; the run calls this
        before the first rollout and after every step that changed the policy."""

    def end_session(self, *, drop_state: bool = False) -> None:
        """Finish the rollout phase; with ``drop_state`` free caches and buffers (and, for an
        engine whose ``drops_weights`` is True, possibly the weights: see the module
        docstring)."""


class WeightsNotHeldError(ArenoError, RuntimeError):
    """``generate`` was called on an engine whose weights were released (or never synced):
    sampling then would stamp completions with a version the engine does not hold."""


def holds_weights(engine: Any) -> bool:
    """Whether ``engine`` samples from the weights of its ``policy_version`` now. Engines may
    declare a ``holds_weights`` attribute (see the module docstring); one that does not is
    taken to hold them."""
    return bool(getattr(engine, "holds_weights", True))


def drops_weights(engine: Any) -> bool:
    """Whether ending a session may discard ``engine``'s weights (its ``drops_weights``
    attribute; False when it declares none), so whoever syncs must be able to push the same
    version again."""
    return bool(getattr(engine, "drops_weights", False))


EngineFactory = Callable[[Any, Any, EngineOptions, Any], RolloutEngine]


@attrs.frozen
class EngineSpec:
    """What a rollout-engine plugin registers (``register_rollout_engines``).

    ``factory(policy, tokenizer, options, config)`` builds the engine for a run: ``policy`` is
    the module being trained (an engine may sample from it directly or keep its own copy, kept
    current by ``sync_weights``), ``options`` the core's :class:`EngineOptions`, ``config`` an
    instance of ``config_cls``, the engine's own options, which become ``areno train`` flags.

    ``check(run_config, config)``, when given, says why the engine cannot run on this machine
    with these options (a missing package, no GPU), or returns None. ``areno train`` calls it
    before any model is loaded (not for ``--dry-run``).

    ``lora_weights`` says what ``sync_weights`` receives when the policy is trained with LoRA
    (``--lora-rank``; without LoRA it always receives the policy module):

    * ``"merged"`` (the default): a state dict of the adapted policy with the adapters merged
      into the base weights, under the base model's names, as a full fine-tune would have them;
    * ``"adapter"``: an :class:`areno_core.models.lora.AdapterWeights` (the adapter in PEFT's
      format, ``save(directory)`` writes it), for engines that serve LoRA adapters themselves;
    * ``"module"``: the live policy module, adapters inside, for engines that sample from the
      training module itself (the native engine).
    """

    name: str
    summary: str
    factory: EngineFactory
    config_cls: type = NoOptions
    check: Callable[[Any, Any], str | None] | None = None
    lora_weights: Literal["merged", "adapter", "module"] = "merged"

    def __attrs_post_init__(self) -> None:
        check_spec_callables("rollout engine", self.name, self.factory, check=self.check)
        if self.lora_weights not in ("merged", "adapter", "module"):
            raise ValueError(
                f"rollout engine {self.name!r}: lora_weights must be 'merged', 'adapter' or "
                f"'module', got {self.lora_weights!r}"
            )

    def make_config(self, options: Any) -> Any:
        """Its config from a mapping or object of run options (declared fields only)."""
        return make_options(self.config_cls, options)

    def unavailable(self, run_config: Any, config: Any) -> str | None:
        """Why this engine cannot run ``run_config`` with its ``config`` here, or None."""
        return None if self.check is None else self.check(run_config, config)

    def create(
        self, policy: Any, tokenizer: Any, options: EngineOptions, config: Any = None
    ) -> RolloutEngine:
        return self.factory(
            policy, tokenizer, options, config if config is not None else self.config_cls()
        )


class RolloutSession:
    """Context manager around one rollout phase of an engine.

    >>> with RolloutSession(engine, drop_state=False) as session:  # doctest: +SKIP
    ...     groups = session.generate(prompt_ids, SamplingParams(max_new_tokens=64), n=8)
    """

    def __init__(self, engine: RolloutEngine, *, drop_state: bool = False) -> None:
        self.engine = engine
        self.drop_state = drop_state
        self._active = False

    def __enter__(self) -> RolloutSession:
        self.engine.start_session()
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        self.engine.end_session(drop_state=self.drop_state)

    @property
    def active(self) -> bool:
        return self._active

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, n: int = 1
    ) -> list[list[Completion]]:
        """Forward to the engine's ``generate``; only valid inside the ``with`` block."""
        if not self._active:
            raise RuntimeError("RolloutSession.generate() called outside its 'with' block")
        return self.engine.generate(prompts, sampling, n=n)

    @property
    def stats(self) -> dict[str, float]:
        return self.engine.stats


__all__ = [
    "ATTN_BACKENDS",
    "AttnBackend",
    "EngineOptions",
    "EngineSpec",
    "RolloutEngine",
    "RolloutSession",
    "WeightsNotHeldError",
    "drops_weights",
    "holds_weights",
]

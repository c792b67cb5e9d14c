"""The checks of ``--async-rollout`` and its options, made when a run's options are resolved.

Kept apart from :mod:`areno_core.runner.async_rollout` (which loads the worker's model stack)
so that resolving options imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areno_core.errors import ConfigError
from areno_core.log import get_logger

if TYPE_CHECKING:
    from areno_core.algorithm import AlgorithmSpec
    from areno_core.config import RunConfig

logger = get_logger(__name__)


def check_async_options(cfg: RunConfig, spec: AlgorithmSpec, explicit: set[str]) -> None:
    """Cheap checks of ``--async-rollout`` and its options (before anything is loaded)."""
    if not cfg.async_rollout:
        given = sorted(
            explicit
            & {
                "max_staleness",
                "rollout_threads",
                "proximal_logprobs",
                "max_inflight_batches",
                "step_fill",
            }
        )
        if given:
            raise ConfigError(
                ", ".join("--" + name.replace("_", "-") for name in given)
                + " applies to asynchronous rollout; add --async-rollout"
            )
        return
    if not spec.needs_rollout:
        raise ConfigError(
            f"--async-rollout runs rollout in a worker process, but --algo {spec.name} trains "
            "on dataset rows and has no rollout"
        )
    if (cfg.world_size or 1) > 1:  # None until resolve fills the machine default
        raise ConfigError(
            f"--async-rollout runs one training process beside its rollout worker; "
            f"--world-size {cfg.world_size} is not supported with it yet (use --world-size 1, "
            "or synchronous rollout with several processes)"
        )
    if "max_inflight_batches" in explicit and cfg.agent_fn is None:
        raise ConfigError(
            f"--max-inflight-batches {cfg.max_inflight_batches} overlaps agentic batches in the "
            "rollout worker; it needs --agent-fn (other batches are rolled out one at a time)"
        )
    if cfg.step_fill == "completion":
        if cfg.agent_fn is None:
            raise ConfigError(
                "--step-fill completion trains each step on the first agentic groups to finish; "
                "it needs --agent-fn (other batches finish all their groups at once)"
            )
        if cfg.max_staleness < 1:
            raise ConfigError(
                "--step-fill completion trains groups of rows sent ahead of the step, which "
                f"--max-staleness {cfg.max_staleness} does not allow: use --max-staleness 1 or "
                "more, or --step-fill batch"
            )
        if cfg.max_inflight_batches < 2:
            logger.warning(
                "--step-fill completion with --max-inflight-batches %d: a batch's slowest "
                "episode still holds the worker, so steps have nothing else to train on and "
                "run as with --step-fill batch; use --max-inflight-batches 2 or more",
                cfg.max_inflight_batches,
            )
    if cfg.max_staleness > 0 and not spec.decoupled:
        raise ConfigError(
            f"--algo {spec.name} does not declare the decoupled objective, so it cannot "
            "correct for samples of an older policy: use --max-staleness 0 with it (every "
            "batch is then sampled by the current policy), or an algorithm that declares it"
        )


__all__ = ["check_async_options"]

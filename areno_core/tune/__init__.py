"""``--tune-params``: measure memory first, then fill ``--max-running-prompts``,
``--batch-size`` and ``--mini-bs``.

::

    outcome = tune_run(resolved, backend=backend, train_kwargs=..., setup_kwargs=...,
                       dtype=torch.bfloat16, attention="flash_attention_2")
    outcome.resolved      # the run with the tuned values (and --drop-rollout-state on)
    outcome.lines         # what was chosen and why, and every probe

The search is :func:`areno_core.tune.search.search`; the probes that measure are
:class:`areno_core.tune.probes.RunProbes`. Values the user gave (flags or ``--config``) are
kept. The tuned run drops its rollout state before each update, so the rollout's KV cache is
not resident during the training step the search measured without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from areno_core.contracts.backend import TrainingBackend
from areno_core.log import get_logger
from areno_core.tune.checks import check_tunable
from areno_core.tune.search import (
    Probes,
    Trial,
    TuneResult,
    TuneSettings,
    derived_batch_size,
    descending_candidates,
    report_lines,
    search,
)

if TYPE_CHECKING:
    from areno_core.resolve import ResolvedRun

logger = get_logger(__name__)

TUNED = ("max_running_prompts", "batch_size", "mini_bs")


@attrs.frozen
class TuneOutcome:
    resolved: ResolvedRun  # the run with the tuned values
    result: TuneResult
    lines: list[str]  # the report: chosen values, why, and every probe

    def to_dict(self) -> dict[str, Any]:
        """The report as data (``tune.yaml`` beside the run's ``config.yaml``)."""
        result = self.result
        return {
            "chosen": result.values(),
            "reasons": dict(result.reasons),
            "capacity_mib": round(result.capacity_bytes / 2**20, 1),
            "budget_mib": round(result.budget_bytes / 2**20, 1),
            "trials": [
                {
                    "phase": t.phase,
                    "value": t.value,
                    "peak_mib": None if t.peak_bytes is None else round(t.peak_bytes / 2**20, 1),
                    "verdict": t.verdict,
                }
                for t in result.trials
            ],
        }


def settings_for(resolved: ResolvedRun) -> TuneSettings:
    """The search settings: the run's limits, and the tuned options the user gave."""
    cfg = resolved.config

    def given(name: str) -> int | None:
        value = getattr(cfg, name)
        return value if name in resolved.explicit and value is not None else None

    return TuneSettings(
        mem_frac=cfg.mem_frac,
        tune_max_samples=cfg.tune_max_samples,
        n_samples=cfg.n_samples,
        max_running_prompts=given("max_running_prompts"),
        batch_size=given("batch_size"),
        mini_bs=given("mini_bs"),
    )


def apply_result(resolved: ResolvedRun, result: TuneResult) -> ResolvedRun:
    """``resolved`` with the tuned values, ``--drop-rollout-state`` on and ``--tune-params``
    off (so the written config.yaml replays the tuned run without tuning again)."""
    config = resolved.config.replace(**result.values(), drop_rollout_state=True, tune_params=False)
    return attrs.evolve(resolved, config=config)


def tune_run(
    resolved: ResolvedRun,
    *,
    backend: TrainingBackend,
    train_kwargs: dict[str, Any],
    setup_kwargs: dict[str, Any],
    dtype: torch.dtype,
    attention: str,
    probes: Probes | None = None,
) -> TuneOutcome:
    """Probe memory and return the run with tuned values (see the module docstring).
    ``probes`` replaces the real probes (tests)."""

    check_tunable(resolved.config, resolved.algorithm)
    real = None
    if probes is None:
        from areno_core.tune.probes import RunProbes  # heavy: loads the run's models to probe

        real = RunProbes(
            resolved,
            backend=backend,
            train_kwargs=train_kwargs,
            setup_kwargs=setup_kwargs,
            dtype=dtype,
            attention=attention,
        )
        probes = real
    try:
        result = search(settings_for(resolved), probes)
    finally:
        if real is not None:
            real.close()
    what = real.meter.what if real is not None else "memory"
    lines = report_lines(result, what=what)
    for line in lines:
        logger.debug("%s", line.strip())
    return TuneOutcome(apply_result(resolved, result), result, lines)


__all__ = [
    "Probes",
    "Trial",
    "TuneOutcome",
    "TuneResult",
    "TuneSettings",
    "apply_result",
    "check_tunable",
    "derived_batch_size",
    "descending_candidates",
    "report_lines",
    "search",
    "settings_for",
    "tune_run",
]

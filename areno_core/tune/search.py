"""The ``--tune-params`` search, independent of how memory is measured.

Given a memory budget (``--mem-frac`` of the device's memory) and probes that report the peak
memory of a rollout with ``R`` sequences decoded at once and of a training step with
microbatches of ``M`` rows, :func:`search` picks:

1. ``--max-running-prompts``: the largest candidate whose rollout fits, trying larger to
   smaller (:func:`descending_candidates` of ``--tune-max-samples``). A candidate whose
   memory floor (the resident models plus its KV cache, known without running it) is already
   over budget is skipped without running. A value the user gave is used as it is, without
   probing the rollout.
2. ``--batch-size``: as many prompts as the chosen concurrency decodes in one wave,
   ``min(R, --tune-max-samples) // --n-samples`` (at least 1); a given value is kept.
3. ``--mini-bs``: the largest candidate up to the step's rows (``batch size x n-samples``)
   whose training step fits, trying larger to smaller; a given value is kept (and measured,
   with a warning when it does not fit).

A probe that runs out of memory reports None; it counts as not fitting.
"""

from __future__ import annotations

from typing import Literal, Protocol

import attrs

from areno_core.errors import NotAvailableError
from areno_core.log import get_logger

logger = get_logger(__name__)

MIB = 1024 * 1024


class Probes(Protocol):
    """What :func:`search` measures with (the real ones are
    :class:`areno_core.tune.probes.RunProbes`)."""

    def capacity_bytes(self) -> int:
        """All the memory of the device (a GPU's memory, or the machine's RAM)."""

    def rollout_floor(self, running: int) -> int:
        """Memory a rollout of ``running`` sequences needs at least, without running it."""

    def rollout(self, running: int) -> int | None:
        """Peak memory of a rollout of ``running`` sequences; None when it ran out."""

    def train(self, mini_bs: int) -> int | None:
        """Peak memory of a training step with microbatches of ``mini_bs`` rows; None when
        it ran out."""


@attrs.frozen
class TuneSettings:
    """The run's options that steer the search (``None``: not given by the user)."""

    mem_frac: float
    tune_max_samples: int
    n_samples: int
    max_running_prompts: int | None = None
    batch_size: int | None = None
    mini_bs: int | None = None


Phase = Literal["rollout", "train"]


@attrs.frozen
class Trial:
    """One candidate tried: what was measured and what it meant."""

    phase: Phase
    value: int
    peak_bytes: int | None
    verdict: str  # "fits", "over budget", "out of memory", "skipped: ..."

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"


@attrs.frozen
class TuneResult:
    max_running_prompts: int
    batch_size: int
    mini_bs: int
    capacity_bytes: int
    budget_bytes: int
    trials: tuple[Trial, ...]
    reasons: dict[str, str]  # option name -> why it has its value

    def values(self) -> dict[str, int]:
        return {
            "max_running_prompts": self.max_running_prompts,
            "batch_size": self.batch_size,
            "mini_bs": self.mini_bs,
        }


def descending_candidates(limit: int) -> list[int]:
    """``limit``, then every power of two below it, largest first: 100 -> 100, 64, ..., 1."""
    if limit < 1:
        raise ValueError(f"the largest candidate must be >= 1, got {limit}")
    out = [limit]
    power = 1 << (limit.bit_length() - 1)
    if power == limit:
        power //= 2
    while power >= 1:
        out.append(power)
        power //= 2
    return out


def derived_batch_size(running: int, settings: TuneSettings) -> int:
    """Prompts whose samples one wave of ``running`` sequences decodes (at least 1)."""
    return max(1, min(running, settings.tune_max_samples) // settings.n_samples)


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:,.0f} MiB"


def _verdict(peak: int | None, budget: int) -> str:
    if peak is None:
        return "out of memory"
    return "fits" if peak <= budget else "over budget"


@attrs.define
class _Budget:
    """The memory budget of one search, and every trial made against it so far."""

    capacity: int
    budget: int
    text: str  # how the budget was set, for messages
    trials: list[Trial] = attrs.field(factory=list)

    @classmethod
    def of(cls, settings: TuneSettings, probes: Probes) -> _Budget:
        capacity = probes.capacity_bytes()
        budget = int(settings.mem_frac * capacity)
        text = f"--mem-frac {settings.mem_frac:g} of {mib(capacity)} = {mib(budget)}"
        return cls(capacity, budget, text)

    def measure(self, phase: Phase, value: int, peak: int | None) -> Trial:
        trial = Trial(phase, value, peak, _verdict(peak, self.budget))
        self.trials.append(trial)
        return trial


def search(settings: TuneSettings, probes: Probes) -> TuneResult:
    """Pick ``--max-running-prompts``, ``--batch-size`` and ``--mini-bs`` (see the module
    docstring); a clear :class:`NotAvailableError` when even the smallest candidate does not
    fit."""
    budget = _Budget.of(settings, probes)
    reasons: dict[str, str] = {}
    running, reasons["max_running_prompts"] = _choose_running(settings, probes, budget)
    batch_size, reasons["batch_size"] = _choose_batch_size(settings, running)
    rows = batch_size * settings.n_samples
    if settings.mini_bs is not None:
        mini_bs = settings.mini_bs
        reasons["mini_bs"] = _measure_given_mini_bs(mini_bs, probes, budget)
    else:
        mini_bs, reasons["mini_bs"] = _choose_mini_bs(rows, probes, budget)
    return TuneResult(
        max_running_prompts=running,
        batch_size=batch_size,
        mini_bs=mini_bs,
        capacity_bytes=budget.capacity,
        budget_bytes=budget.budget,
        trials=tuple(budget.trials),
        reasons=reasons,
    )


def _choose_running(settings: TuneSettings, probes: Probes, budget: _Budget) -> tuple[int, str]:
    """Step 1, the rollout concurrency, and why."""
    if settings.max_running_prompts is not None:
        return settings.max_running_prompts, "given; the rollout was not probed"
    chosen: Trial | None = None
    for candidate in descending_candidates(settings.tune_max_samples):
        floor = probes.rollout_floor(candidate)
        if floor > budget.budget:
            budget.trials.append(
                Trial("rollout", candidate, None, f"skipped: needs at least {mib(floor)}")
            )
            continue
        trial = budget.measure("rollout", candidate, probes.rollout(candidate))
        if trial.fits:
            chosen = trial
            break
    if chosen is None:
        raise NotAvailableError(
            "--tune-params: even a rollout of 1 sequence at a time does not fit in "
            f"{budget.text} ({_last_measure(budget.trials)}); lower --max-new-tokens or "
            "--max-prompt-tokens, raise --mem-frac, or use a smaller model"
        )
    tried = [t.value for t in budget.trials]
    return chosen.value, (
        f"the largest candidate that fits (tried {_listing(tried)}); its rollout peaked "
        f"at {mib(chosen.peak_bytes)}"
    )


def _choose_batch_size(settings: TuneSettings, running: int) -> tuple[int, str]:
    """Step 2, the prompts per step, and why."""
    if settings.batch_size is not None:
        return settings.batch_size, "given"
    return derived_batch_size(running, settings), (
        f"min({running} rollout rows, --tune-max-samples {settings.tune_max_samples}) "
        f"// --n-samples {settings.n_samples}"
    )


def _measure_given_mini_bs(mini_bs: int, probes: Probes, budget: _Budget) -> str:
    """Step 3 with a microbatch the user gave: measured and kept, with a warning when it
    does not fit; returns why it has its value."""
    peak = probes.train(mini_bs)
    trial = budget.measure("train", mini_bs, peak)
    if trial.fits:
        return f"given; its training step peaked at {mib(peak)}"
    logger.warning(
        "--tune-params: the given --mini-bs %d %s (%s; budget %s); the run may run out of memory",
        mini_bs,
        "ran out of memory in the probe" if peak is None else "is over budget",
        mib(peak),
        budget.text,
    )
    return f"given, kept although its training step {trial.verdict}"


def _choose_mini_bs(rows: int, probes: Probes, budget: _Budget) -> tuple[int, str]:
    """Step 3, the largest microbatch up to the step's ``rows`` that fits, and why."""
    chosen: Trial | None = None
    tried: list[int] = []
    for candidate in descending_candidates(rows):
        trial = budget.measure("train", candidate, probes.train(candidate))
        tried.append(candidate)
        if trial.fits:
            chosen = trial
            break
    if chosen is None:
        raise NotAvailableError(
            "--tune-params: even a training microbatch of 1 row does not fit in "
            f"{budget.text} ({_last_measure(budget.trials)}); lower --max-new-tokens or "
            "--max-prompt-tokens, keep --activation-checkpointing on, or use a smaller "
            "model"
        )
    return chosen.value, (
        f"the largest candidate up to the step's {rows} rows that fits (tried "
        f"{_listing(tried)}); its training step peaked at {mib(chosen.peak_bytes)}"
    )


def _listing(values: list[int]) -> str:
    return (
        ", ".join(str(v) for v in values)
        if len(values) <= 4
        else (f"{values[0]}, {values[1]}, ..., {values[-1]}")
    )


def _last_measure(trials: list[Trial]) -> str:
    last = trials[-1]
    if last.peak_bytes is None:
        return f"the last probe: {last.verdict}"
    return f"the last probe peaked at {mib(last.peak_bytes)}"


def report_lines(result: TuneResult, *, what: str) -> list[str]:
    """The chosen values and why, then every trial, as plain lines (``what``: what was
    measured, e.g. "GPU memory")."""
    share = result.budget_bytes / max(result.capacity_bytes, 1)
    lines = [
        f"--tune-params measured {what}: budget {mib(result.budget_bytes)} "
        f"({share:.0%} of {mib(result.capacity_bytes)})",
    ]
    for name, value in result.values().items():
        flag = "--" + name.replace("_", "-")
        lines.append(f"  {flag} {value}: {result.reasons[name]}")
    lines.append("  --drop-rollout-state: on (rollout memory is freed before each update)")
    for trial in result.trials:
        flag = "--max-running-prompts" if trial.phase == "rollout" else "--mini-bs"
        lines.append(
            f"    {trial.phase} {flag} {trial.value}: {mib(trial.peak_bytes)}, {trial.verdict}"
        )
    return lines


__all__ = [
    "Probes",
    "Trial",
    "TuneResult",
    "TuneSettings",
    "derived_batch_size",
    "descending_candidates",
    "report_lines",
    "search",
]

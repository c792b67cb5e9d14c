"""Validation gates: check a finished run's metrics history and checkpoints against a recipe.

A gate (:class:`~areno_core.recipe.Gate`) is data on a recipe; this module is the code that
decides whether a run passed it, so nobody has to read a loss curve by eye::

    from areno_core.gates import check_run
    from areno_core.registry import get_registry

    recipe = get_registry().recipe("math/gsm8k")
    report = check_run(recipe, "runs/gsm8k-grpo")      # the run's --save-path
    for result in report.results:
        print(result.passed, result.gate.describe(), result.reason)
    assert report.passed

The metrics history is ``metrics.jsonl`` (one JSON object per logged step, written by
:class:`~areno_core.metrics.logger.MetricsLogger`); checkpoints are the ``step_<N>``
directories of :mod:`areno_core.train.checkpoint`.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import yaml
from transformers import AutoModelForCausalLM

from areno_core.errors import did_you_mean
from areno_core.log import get_logger
from areno_core.metrics.logger import JSONL_FILE, read_jsonl
from areno_core.models.loading import load_model, load_tokenizer
from areno_core.models.lora import load_adapter_weights
from areno_core.recipe import Gate, Recipe
from areno_core.train.checkpoint import (
    ADAPTER_CONFIG_FILE,
    MANIFEST_FILE,
    find_latest_checkpoint,
    is_complete_checkpoint,
    missing_files,
    read_checkpoint_config,
    read_weights,
)

logger = get_logger(__name__)

Row = Mapping[str, Any]


@attrs.frozen
class GateResult:
    """Whether one gate passed, what was observed, and why (always filled, pass or fail)."""

    gate: Gate
    passed: bool
    reason: str
    observed: float | None = None


@attrs.frozen
class GateReport:
    results: tuple[GateResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[GateResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    def summary(self) -> str:
        done = sum(r.passed for r in self.results)
        return f"{done}/{len(self.results)} gates passed"


def recipe_gates(recipe: Recipe) -> tuple[Gate, ...]:
    """The recipe's gates, plus ``metric_exists`` for each expected metric not gated already."""
    gated = {g.metric for g in recipe.gates if g.metric}
    implied = tuple(
        Gate("metric_exists", metric, description="expected metric")
        for metric in recipe.expected_metrics
        if metric not in gated
    )
    return (*recipe.gates, *implied)


def metrics_dir_of(run_dir: str | os.PathLike[str]) -> Path:
    """Where a run wrote ``metrics.jsonl``: its ``--metrics-log-dir`` or ``<run>/tensorboard``.

    The custom directory is read from the ``config.yaml`` the run saved in ``run_dir``.
    """

    config_file = Path(run_dir) / "config.yaml"
    custom = None
    if config_file.is_file():
        try:
            config = yaml.safe_load(config_file.read_text()) or {}
            custom = (config.get("observability") or {}).get("metrics_log_dir")
        except (yaml.YAMLError, AttributeError):
            logger.warning(
                "%s is unreadable; looking for metrics in the default place", config_file
            )
    return Path(custom) if custom else Path(run_dir) / "tensorboard"


def read_history(metrics_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` in ``metrics_dir``; an empty list when there is none."""

    if not (Path(metrics_dir) / JSONL_FILE).is_file():
        return []
    return read_jsonl(metrics_dir)


def check_run(
    recipe_or_gates: Recipe | Iterable[Gate],
    run_dir: str | os.PathLike[str],
    *,
    metrics_dir: str | os.PathLike[str] | None = None,
) -> GateReport:
    """Evaluate gates against the run saved under ``run_dir`` (its ``--save-path``).

    Given a :class:`Recipe`, its gates plus its expected metrics are checked (see
    :func:`recipe_gates`). ``metrics_dir`` defaults to ``<run_dir>/tensorboard``.
    """
    gates = (
        recipe_gates(recipe_or_gates)
        if isinstance(recipe_or_gates, Recipe)
        else tuple(recipe_or_gates)
    )
    history = read_history(metrics_dir if metrics_dir is not None else metrics_dir_of(run_dir))
    return GateReport(tuple(evaluate_gate(g, history, checkpoint_root=run_dir) for g in gates))


def evaluate_gates(
    gates: Iterable[Gate],
    history: Sequence[Row],
    *,
    checkpoint_root: str | os.PathLike[str] | None = None,
) -> GateReport:
    """Evaluate ``gates`` on a metrics ``history`` (rows with a ``step`` key) and checkpoints."""
    return GateReport(
        tuple(evaluate_gate(g, history, checkpoint_root=checkpoint_root) for g in gates)
    )


def evaluate_gate(
    gate: Gate,
    history: Sequence[Row],
    *,
    checkpoint_root: str | os.PathLike[str] | None = None,
) -> GateResult:
    """Evaluate one gate. Never raises for a bad run: failures come back with a reason."""
    if gate.kind == "checkpoint_loadable":
        if checkpoint_root is None:
            return GateResult(gate, False, "no run directory was given to look for checkpoints")
        return _checkpoint_gate(gate, Path(checkpoint_root))
    assert gate.metric is not None  # Gate's own validation guarantees it
    points = _window(history, gate.metric, gate.after_step)
    where = f" at steps >= {gate.after_step}" if gate.after_step is not None else ""
    if not points:
        logged = sorted({k for row in history for k in row if k != "step"})
        hint = _missing_hint(gate.metric, logged, len(history))
        return GateResult(gate, False, f"{gate.metric} was not logged{where}{hint}")
    values = [v for _, v in points]
    if gate.kind == "metric_exists":
        return GateResult(gate, True, f"{len(values)} value(s) logged{where}", values[-1])
    if gate.kind == "finite":
        bad = [(s, v) for s, v in points if not math.isfinite(v)]
        if bad:
            step, value = bad[0]
            return GateResult(
                gate, False, f"{gate.metric} is {value} at step {step} ({len(bad)} bad)", value
            )
        return GateResult(gate, True, f"{len(values)} value(s), all finite", values[-1])
    if gate.kind in ("at_least", "at_most"):
        return _threshold_gate(gate, points)
    return _trend_gate(gate, points)


def _window(history: Sequence[Row], metric: str, after_step: int | None) -> list[tuple[int, float]]:
    points: list[tuple[int, float]] = []
    for index, row in enumerate(history):
        if metric not in row:
            continue
        step = int(row.get("step", index + 1))
        if after_step is not None and step < after_step:
            continue
        value = row[metric]
        try:
            points.append((step, float(value)))
        except (TypeError, ValueError):
            points.append((step, math.nan))
    return points


def _missing_hint(metric: str, logged: list[str], rows: int) -> str:
    if not rows:
        return " (the run logged no metrics at all)"
    hint = did_you_mean(metric, logged, n=2, render=str)
    return f";{hint}" if hint else f" ({rows} rows logged)"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _threshold_gate(gate: Gate, points: list[tuple[int, float]]) -> GateResult:
    assert gate.threshold is not None
    if gate.after_step is None:
        step, observed = points[-1]
        what = f"last {gate.metric} (step {step})"
    else:
        observed = _mean([v for _, v in points])
        what = f"mean {gate.metric} over {len(points)} step(s) >= {gate.after_step}"
    if not math.isfinite(observed):
        return GateResult(gate, False, f"{what} is {observed}", observed)
    ok = observed >= gate.threshold if gate.kind == "at_least" else observed <= gate.threshold
    op = (">=" if ok else "<") if gate.kind == "at_least" else ("<=" if ok else ">")
    return GateResult(gate, ok, f"{what} = {observed:.4g} {op} {gate.threshold:g}", observed)


def _trend_gate(gate: Gate, points: list[tuple[int, float]]) -> GateResult:
    values = [v for _, v in points]
    if len(values) < 2:
        return GateResult(
            gate, False, f"{gate.metric} needs two or more values to {gate.kind[:-1]}, has 1"
        )
    k = max(1, len(values) // 3)
    first, last = _mean(values[:k]), _mean(values[-k:])
    change = last - first
    margin = gate.threshold or 0.0
    if not math.isfinite(change):
        return GateResult(gate, False, f"{gate.metric} has non-finite values", change)
    ok = change > margin if gate.kind == "rises" else -change > margin
    span = f"mean of first {k} = {first:.4g}, of last {k} = {last:.4g}"
    need = f"needs to {gate.kind[:-1]} by more than {margin:g}"
    verdict = "ok" if ok else need
    return GateResult(gate, ok, f"{gate.metric}: {span} ({verdict})", change)


# -- checkpoints ---------------------------------------------------------------------------


def _checkpoint_gate(gate: Gate, root: Path) -> GateResult:

    if not root.is_dir():
        return GateResult(gate, False, f"no run directory at {root}")
    if is_complete_checkpoint(root):
        path: Path | None = root
    else:
        path = find_latest_checkpoint(root)
    if path is None:
        partial = sorted(p.name for p in root.glob("step_*") if p.is_dir())
        if partial:
            problems = missing_files(root / partial[-1])
            return GateResult(gate, False, f"{root / partial[-1]} is incomplete: {problems[0]}")
        return GateResult(gate, False, f"no checkpoint under {root}")
    step = _checkpoint_step(path)
    if gate.after_step is not None and step < gate.after_step:
        return GateResult(
            gate, False, f"newest checkpoint {path.name} is before step {gate.after_step}", step
        )
    try:
        _load_and_probe(path)
    except Exception as exc:  # any failure to load is the gate's answer, not a crash
        message = " ".join(str(exc).split())[:300]
        return GateResult(gate, False, f"{path} does not load: {type(exc).__name__}: {message}")
    return GateResult(gate, True, f"{path.name} loads and gives finite logits", step)


def _checkpoint_step(path: Path) -> float:

    try:
        return float(json.loads((path / MANIFEST_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return math.nan


def _load_and_probe(path: Path) -> None:
    """Load the policy exactly (no missing or unexpected tensors) and its tokenizer; run it."""

    if (path / ADAPTER_CONFIG_FILE).is_file():
        model = _load_adapter_checkpoint(path)
    else:
        model, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
        for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
            if info.get(key):
                raise ValueError(f"{key.replace('_', ' ')}: {list(info[key])[:3]}")
    tokenizer = load_tokenizer(str(path))
    ids = tokenizer("1 + 1 =", return_tensors="pt").input_ids
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits
    if not torch.isfinite(logits).all():
        raise ValueError("the model's logits are not finite")
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    for name in manifest.get("extra_models", []):
        extra = path / name
        weights = read_weights(extra)
        bad = [name for name, t in weights.items() if not torch.isfinite(t).all()]
        if bad:
            raise ValueError(f"{extra.name}/ holds non-finite tensors, e.g. {bad[0]}")


def _load_adapter_checkpoint(path: Path) -> Any:
    """A LoRA checkpoint's policy: the base model its run trained on (``ckpt`` in its
    config.yaml) with the saved adapter, loaded by PEFT exactly as a user would."""
    from peft import PeftModel  # optional extra areno-core[lora]

    base = read_checkpoint_config(path).get("basic", {}).get("ckpt")
    if not base:
        raise ValueError("config.yaml names no base model (basic.ckpt) for the adapter")
    with warnings.catch_warnings():
        # PEFT reads transformers' deprecated is_gradient_checkpointing property.
        warnings.simplefilter("ignore", FutureWarning)
        model = PeftModel.from_pretrained(load_model(str(base)), str(path))
    load_adapter_weights(model, path)  # strictly: every saved tensor, no missing one
    return model

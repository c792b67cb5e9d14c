"""``areno eval``: score checkpoints on a held-out set with the rollout engines of training.

::

    areno eval --recipe math/arith --ckpt runs/demo-arith/step_500
    areno eval --recipe math/arith --ckpt runs/demo-arith --n-samples 8 --pass-k 1,4,8
    areno eval --ckpt my-model --dataset-path test.jsonl --dataset-loader-fn loader.py \\
        --reward-fn-path reward.py

What is evaluated (:class:`EvalSettings`) comes from, lowest first: the core's defaults, the
recipe's options (``eval_dataset_path``, loader, reward, ``max_new_tokens``, ...), the
evaluator the recipe's pack registered (``register_evaluators``), then the flags. So with the
recipe's settings and the same engine, ``accuracy`` is what training logged as
``eval/accuracy`` for that checkpoint.

Per checkpoint: one greedy completion per prompt (``accuracy``: share of rewards at least the
evaluator's ``correct_at``, 1 by default; ``reward_mean``; response lengths; truncation), and
with ``--n-samples N`` N sampled completions per prompt (``pass@k`` by the unbiased estimator,
see :mod:`areno_core.evaluators`). Every input is checked before any model is loaded.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from areno_core.accel.attention import FLASH, choose_attention
from areno_core.accel.precision import resolve_run_dtype
from areno_core.config import DTYPE_CHOICES, default_of
from areno_core.contracts.engine import EngineOptions, RolloutSession
from areno_core.data import apply_loader, load_rows, resolve_loader
from areno_core.errors import ConfigError
from areno_core.evaluators import EvaluatorSpec, greedy_metrics, sampled_metrics
from areno_core.models.loading import load_model_and_tokenizer
from areno_core.recipe import Recipe, resolve_resource
from areno_core.registry import Registry
from areno_core.resolve import find_recipe
from areno_core.rewards import RewardScorer, resolve_reward_fn
from areno_core.rollout.collect import collect_groups, prompt_item
from areno_core.types import SamplingParams

# Where a setting comes from in a recipe's options (the ``areno train`` option names).
_RECIPE_KEYS = {
    "dataset": "eval_dataset_path",
    "loader": "dataset_loader_fn",
    "reward": "reward_fn_path",
    "max_new_tokens": "max_new_tokens",
    "max_prompt_tokens": "max_prompt_tokens",
    "limit": "eval_limit",
    "disable_thinking": "disable_thinking",
    "max_running_prompts": "max_running_prompts",
    "attn_backend": "attn_backend",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
}


@attrs.frozen
class EvalSettings:
    """Everything one ``areno eval`` needs besides the checkpoints."""

    dataset: str
    reward: str
    loader: str | None = None
    limit: int | None = None
    max_new_tokens: int = 512
    max_prompt_tokens: int = 1024
    disable_thinking: bool = False
    n_samples: int = 0  # sampled completions per prompt for pass@k (0: greedy only)
    pass_k: tuple[int, ...] = ()
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int = 0
    correct_at: float = 1.0
    engine: str = "native"
    max_running_prompts: int | None = None
    attn_backend: str = "flash"  # as in training: native where flash-attn cannot run
    device: str = "auto"
    dtype: str = "auto"
    recipe: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class CheckpointRef:
    """One checkpoint to evaluate: its label in the table, what the loader gets, its step."""

    label: str
    path: str
    step: int | None = None


def eval_settings(
    flags: Mapping[str, Any], registry: Registry, *, algo: str | None = None
) -> tuple[EvalSettings, EvaluatorSpec | None]:
    """The settings of an evaluation: defaults < recipe < its evaluator < ``flags`` (only the
    flags given, keyed like :class:`EvalSettings`), and the recipe's evaluator if any."""
    values: dict[str, Any] = {k: default_of(v) for k, v in _RECIPE_KEYS.items() if k != "dataset"}
    values.pop("limit")
    evaluator = None
    name = flags.get("recipe")
    if name:
        recipe = find_recipe(registry, name)
        options = recipe.options_for(_recipe_algo(recipe, algo), rollout=True)
        values.update({k: options[v] for k, v in _RECIPE_KEYS.items() if v in options})
        evaluator = registry.evaluator(recipe.name)
        if evaluator is not None:
            fields = ("dataset", "loader", "reward", "max_new_tokens", "limit")
            values.update(
                {
                    f: resolve_resource(getattr(evaluator, f))
                    for f in fields
                    if getattr(evaluator, f) is not None
                }
            )
            values["correct_at"] = evaluator.correct_at
        values["recipe"] = recipe.name
    values.update({k: v for k, v in flags.items() if k != "recipe" and v is not None})
    missing = [
        flag for key, flag in (("dataset", "--dataset-path"), ("reward", "--reward-fn-path"))
        if not values.get(key)
    ]  # fmt: skip
    if missing:
        raise ConfigError(
            f"areno eval needs {' and '.join(missing)}: give them, or a --recipe whose pack "
            "defines its evaluation set (e.g. --recipe math/arith)"
        )
    settings = EvalSettings(**{k: v for k, v in values.items() if k in _FIELDS})
    return _checked(settings), evaluator


_FIELDS = {f.name for f in attrs.fields(EvalSettings)}


def _recipe_algo(recipe: Recipe, algo: str | None) -> str:
    """``--algo``, else the default algorithm if the recipe runs it, else its first one."""
    if algo:
        return algo
    default = default_of("algo")
    return default if default in recipe.algorithms else recipe.algorithms[0]


def _checked(s: EvalSettings) -> EvalSettings:
    if s.n_samples < 0:
        raise ConfigError(f"--n-samples must be 0 (greedy only) or more, got {s.n_samples}")
    pass_k = s.pass_k or ((1, s.n_samples) if s.n_samples > 1 else (1,) if s.n_samples else ())
    pass_k = tuple(sorted(set(pass_k)))
    if pass_k and not s.n_samples:
        raise ConfigError("--pass-k needs --n-samples N (the samples per prompt it counts)")
    bad = [k for k in pass_k if not 1 <= k <= s.n_samples]
    if bad:
        raise ConfigError(
            f"--pass-k {bad[0]} is not between 1 and --n-samples {s.n_samples}: pass@k counts "
            "k of the n samples drawn per prompt"
        )
    for name in ("max_new_tokens", "max_prompt_tokens", "limit", "max_running_prompts"):
        value = getattr(s, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if s.attn_backend not in ("flash", "native"):
        raise ConfigError(f"--attn-backend must be flash or native, got {s.attn_backend!r}")
    if s.dtype not in DTYPE_CHOICES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {s.dtype!r}")
    if s.n_samples and s.temperature <= 0:
        raise ConfigError(f"--temperature must be positive for sampling, got {s.temperature}")
    return attrs.evolve(s, pass_k=pass_k)


# -- checkpoints ---------------------------------------------------------------------------

_MODEL_FILES = ("config.json", "adapter_config.json")


def find_checkpoints(refs: Sequence[str]) -> list[CheckpointRef]:
    """Expand ``--ckpt`` values: a model directory (a ``step_N``, a LoRA adapter, any saved
    model) is itself; a run's ``--save-path`` is each of its ``step_N`` in order; anything
    else that is not a path (a hub id, ``random:...``) goes to the model loader as it is."""
    found: list[CheckpointRef] = []
    for ref in refs:
        path = Path(str(resolve_resource(ref)))
        if path.is_dir():
            if any((path / f).is_file() for f in _MODEL_FILES):
                found.append(CheckpointRef(ref, str(path), _step_of(path)))
                continue
            steps = sorted(
                (_step_of(p), p) for p in path.glob("step_*") if p.is_dir() and _step_of(p)
            )
            if not steps:
                raise ConfigError(
                    f"--ckpt {ref!r} is a directory with no model (config.json or "
                    "adapter_config.json) and no step_N checkpoints"
                )
            found += [CheckpointRef(str(p), str(p), step) for step, p in steps]
        elif path.exists() or looks_local(ref):
            raise ConfigError(f"--ckpt {ref!r}: no such checkpoint directory")
        else:
            found.append(CheckpointRef(ref, ref))
    unique = {os.path.realpath(c.path) if Path(c.path).exists() else c.path: c for c in found}
    return list(unique.values())


def looks_local(ref: str) -> bool:
    """Whether ``ref`` means a local path rather than a hub id (``org/name``): it starts with
    ``.``, ``/`` or ``~``, has more than one ``/``, or its first part is a local directory."""
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        return True
    return "/" in ref and Path(ref.split("/", 1)[0]).is_dir()


def _step_of(path: Path) -> int | None:
    prefix, _, number = path.name.partition("_")
    return int(number) if prefix == "step" and number.isdigit() else None


# -- evaluation ----------------------------------------------------------------------------


def load_eval_rows(settings: EvalSettings, registry: Registry) -> list[dict[str, Any]]:
    """The held-out rows after the loader, then the first ``limit`` (as training does)."""
    loader = resolve_loader(settings.loader, lambda name: registry.get("dataset_loaders", name))
    rows = load_rows(settings.dataset)
    rows = apply_loader(rows, loader) if loader is not None else list(rows)
    rows = rows[: settings.limit] if settings.limit else rows
    if not rows:
        raise ConfigError(f"--dataset-path {settings.dataset!r}: no rows left after the loader")
    bad = [i for i, row in enumerate(rows) if not isinstance(row.get("prompt"), (str, list))]
    if bad:
        raise ConfigError(
            f"--dataset-path {settings.dataset!r}: row {bad[0]} has no 'prompt' (text or chat "
            f"messages) after the loader (its keys: {', '.join(sorted(rows[bad[0]]))}); give "
            "--dataset-loader-fn to build it"
        )
    return rows


def eval_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_checkpoint_model(path: str, device: str, dtype: str, attn_backend: str) -> Any:
    """``(model, tokenizer)`` in eval mode, with the dtype and attention training would use."""

    torch_dtype = resolve_run_dtype(dtype, device)
    attention = choose_attention(attn_backend, device, torch_dtype)
    model, tokenizer = load_model_and_tokenizer(
        path,
        dtype=torch_dtype,
        device=device,
        attn_implementation=attention if attention == FLASH else None,
    )
    model.eval()
    return model, tokenizer


Progress = Callable[[str], None]


def evaluate_checkpoint(
    ckpt: CheckpointRef,
    rows: Sequence[dict[str, Any]],
    settings: EvalSettings,
    *,
    registry: Registry,
    reward_fn: Any,
    evaluator: EvaluatorSpec | None = None,
    progress: Progress = lambda phase: None,
) -> dict[str, float]:
    """Load one checkpoint and score it (see the module docstring); the metrics by name."""
    progress("loading")
    started = time.perf_counter()
    device = eval_device(settings.device)
    model, tokenizer = load_checkpoint_model(
        ckpt.path, device, settings.dtype, settings.attn_backend
    )
    spec = registry.engine(settings.engine)
    options = EngineOptions(
        max_running=settings.max_running_prompts,
        max_prompt_tokens=settings.max_prompt_tokens,
        attn_backend=settings.attn_backend,
    )
    engine = spec.create(model, tokenizer, options, spec.make_config({}))
    items = [prompt_item(i, dict(row)) for i, row in enumerate(rows)]
    scorer = RewardScorer(reward_fn, fail_fraction=1.0)

    def collect(sampling: SamplingParams, n: int, generator: Any = None) -> Any:
        with torch.no_grad(), RolloutSession(engine, drop_state=True):
            return collect_groups(
                items,
                engine=engine,
                tokenizer=tokenizer,
                sampling=sampling,
                n_samples=n,
                scorer=scorer,
                disable_thinking=settings.disable_thinking,
                generator=generator,
            )

    progress("greedy")
    greedy = SamplingParams(max_new_tokens=settings.max_new_tokens, greedy=True)
    groups, stats = collect(greedy, 1)
    metrics = greedy_metrics(groups, correct_at=settings.correct_at)
    metrics["skipped_prompts"] = stats.get("rollout/skipped_prompts", 0.0)
    metrics["reward_errors"] = stats.get("rollout/reward_errors", 0.0)
    if evaluator is not None and evaluator.extra_metrics is not None:
        metrics.update(evaluator.extra_metrics(groups))
    if settings.n_samples:
        progress(f"{settings.n_samples} samples per prompt")
        sampling = SamplingParams(
            max_new_tokens=settings.max_new_tokens,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
        )
        generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        sampled, _ = collect(sampling, settings.n_samples, generator)
        metrics.update(sampled_metrics(sampled, settings.pass_k, correct_at=settings.correct_at))
    metrics["seconds"] = time.perf_counter() - started
    return metrics


def write_json(path: Path, settings: EvalSettings, results: list[dict[str, Any]]) -> None:
    """The whole report, replaced atomically (a crash never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"settings": settings.to_dict(), "results": results}, indent=1))
    os.replace(tmp, path)


def check_output(path: Path) -> None:
    """Fail before any work when the report cannot be written."""
    if path.is_dir():
        raise ConfigError(f"--output {str(path)!r} is a directory; give a file name (.json)")
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--output {str(path)!r}: {folder} is not writable")


@attrs.frozen
class EvalPlan:
    settings: EvalSettings
    evaluator: EvaluatorSpec | None
    checkpoints: list[CheckpointRef]
    rows: list[dict[str, Any]]
    reward_fn: Any
    output: Path


def plan_eval(
    flags: Mapping[str, Any],
    ckpts: Sequence[str],
    output: str | None,
    registry: Registry,
    *,
    algo: str | None = None,
) -> EvalPlan:
    """Every check of ``areno eval``, before any model is loaded."""
    if not ckpts:
        raise ConfigError("--ckpt is required: a step_N directory, a run's --save-path, ...")
    settings, evaluator = eval_settings(flags, registry, algo=algo)
    registry.engine(settings.engine)  # an unknown engine fails here
    checkpoints = find_checkpoints(ckpts)
    reward_fn = resolve_reward_fn(settings.reward, registry)
    rows = load_eval_rows(settings, registry)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(output) if output else Path("runs") / f"eval-{stamp}.json"
    check_output(path)
    return EvalPlan(settings, evaluator, checkpoints, rows, reward_fn, path)


def run_eval(
    plan: EvalPlan,
    registry: Registry,
    *,
    on_progress: Callable[[CheckpointRef, str], None] = lambda ckpt, phase: None,
    on_result: Callable[[dict[str, Any]], None] = lambda result: None,
) -> list[dict[str, Any]]:
    """Evaluate every checkpoint of ``plan``; the JSON report is rewritten after each."""
    results: list[dict[str, Any]] = []
    for ckpt in plan.checkpoints:
        metrics = evaluate_checkpoint(
            ckpt,
            plan.rows,
            plan.settings,
            registry=registry,
            reward_fn=plan.reward_fn,
            evaluator=plan.evaluator,
            progress=lambda phase, c=ckpt: on_progress(c, phase),
        )
        result = {"checkpoint": ckpt.path, "step": ckpt.step, "metrics": metrics}
        results.append(result)
        write_json(plan.output, plan.settings, results)
        on_result(result)
    return results

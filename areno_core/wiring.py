"""From a resolved run to what the training loop drives: the checked rows, the reward and
agent, the rollout engine in its runner (in this process or in a worker), the held-out
evaluation, and the keyword arguments of the backend's ``train``.

:func:`plan_run` does everything that can fail on bad input (rows, loader, reward and agent
files, resume path, trackers, output directories) before any model is loaded or anything is
written; :mod:`areno_core.run` then loads the model and runs the loop over these pieces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from areno_core.accel.attention import FLASH, uses_flash
from areno_core.agentic.collect import resolve_agent_fn
from areno_core.algorithm import AlgorithmSpec
from areno_core.config import RunConfig
from areno_core.contracts.backend import TrainingBackend
from areno_core.contracts.engine import EngineOptions
from areno_core.contracts.sink import SinkSpec
from areno_core.data import (
    apply_loader,
    load_rows,
    parse_env_args,
    resolve_loader,
    split_preference_rows,
    validate_rows,
)
from areno_core.data.stream import DataStream
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.metrics.sinks import check_sinks, parse_report_to
from areno_core.model import TrainableModel
from areno_core.models.chat import encode_prompt
from areno_core.models.loading import load_tokenizer
from areno_core.models.lora import LoraSettings, check_resume_adapter
from areno_core.registry import Registry
from areno_core.resolve import ResolvedRun
from areno_core.rewards import resolve_reward_fn
from areno_core.runner.async_rollout import AsyncRolloutRunner
from areno_core.runner.boot import WorkerProcess
from areno_core.runner.rollout import AgentSettings, RolloutRunner
from areno_core.runner.worker import WorkerSpec
from areno_core.train.checkpoint import (
    check_resume_dataset,
    check_writable_dir,
    find_latest_checkpoint,
)
from areno_core.train.optim import check_adam_8bit_available


@attrs.define
class RunPlan:
    """Everything decided before heavy work starts."""

    resolved: ResolvedRun
    config: RunConfig
    spec: AlgorithmSpec
    rows: list[dict[str, Any]]
    reward_fn: Any
    agent_fn: Any
    resume_from: Path | None
    output_dir: Path
    metrics_dir: Path
    eval_rows: list[dict[str, Any]] | None = None
    sinks: list[SinkSpec] = attrs.Factory(list)


def _loaded_rows(path: str, cfg: RunConfig, registry: Registry) -> list[dict]:
    """Rows of the dataset at ``path`` after ``--dataset-loader-fn`` (when one is given)."""
    rows = load_rows(path)
    loader = resolve_loader(
        cfg.dataset_loader_fn, lambda name: registry.get("dataset_loaders", name)
    )
    env_args = parse_env_args(cfg.env_args)
    if loader is None:
        if env_args is not None:
            raise ConfigError("--env-args needs a --dataset-loader-fn that takes them")
        return rows
    return apply_loader(rows, loader, env_args=env_args)


def load_training_rows(cfg: RunConfig, spec: AlgorithmSpec, registry: Registry) -> list[dict]:
    """Read the dataset, apply the loader, and check the rows against the algorithm schema."""
    rows = _loaded_rows(cfg.dataset_path, cfg, registry)
    if not rows:
        raise ConfigError(f"--dataset-path {cfg.dataset_path!r}: no rows left after the loader")
    if spec.kind == "preference":
        rows = split_preference_rows(rows, algo=spec.name, source=cfg.dataset_path)
    validate_rows(rows, spec.row_schema, algo=spec.name, source=cfg.dataset_path)
    return rows


def load_eval_rows(cfg: RunConfig, spec: AlgorithmSpec, registry: Registry) -> list[dict]:
    """The ``--eval-dataset-path`` rows after the loader (first ``--eval-limit``), checked."""
    if cfg.agent_fn is not None:
        raise NotAvailableError(
            "--eval-dataset-path with --agent-fn is not available yet: evaluation runs direct "
            "prompts only"
        )
    rows = _loaded_rows(cfg.eval_dataset_path, cfg, registry)
    rows = rows[: cfg.eval_limit] if cfg.eval_limit else rows
    if not rows:
        raise ConfigError(
            f"--eval-dataset-path {cfg.eval_dataset_path!r}: no rows left after the loader"
        )
    if spec.kind == "preference":
        rows = split_preference_rows(rows, algo=spec.name, source=cfg.eval_dataset_path)
    validate_rows(rows, spec.row_schema, algo=spec.name, source=cfg.eval_dataset_path)
    return rows


# Training options that ``backend.evaluate`` takes too (the rest update weights).
_EVAL_KWARGS = ("mini_bs", "temperature", "max_prompt_tokens", "max_new_tokens", "disable_thinking")


def build_loss_evaluator(
    plan: RunPlan, model: TrainableModel, backend: TrainingBackend, kwargs: dict[str, Any]
) -> Any:
    """Held-out loss for sft and dpo: the algorithm's statistics on the eval rows, no update."""
    options = {k: v for k, v in kwargs.items() if k in _EVAL_KWARGS}
    options.update(attrs.asdict(plan.resolved.algorithm_config))
    rows = plan.eval_rows or []

    def evaluate() -> dict[str, float]:
        started = time.perf_counter()
        metrics = backend.evaluate(model, rows, algorithm=plan.spec, **options)
        metrics["time/eval"] = time.perf_counter() - started
        return metrics

    return evaluate


def plan_run(resolved: ResolvedRun, registry: Registry) -> RunPlan:
    cfg = resolved.config
    spec = resolved.algorithm
    agent_fn = None
    if cfg.agent_fn is not None:
        agent_fn = resolve_agent_fn(cfg.agent_fn, registry)
    reward_fn = None
    if spec.needs_rollout:
        if cfg.reward_fn_path is None and cfg.reward_ckpt is None:
            raise ConfigError(
                f"--algo {spec.name} scores completions: give --reward-fn-path (a file or a "
                "registered reward name)"
                + (" or --reward-ckpt" if spec.accepts("reward_model") else "")
            )
        if cfg.reward_fn_path is not None:
            reward_fn = resolve_reward_fn(cfg.reward_fn_path, registry)
    if cfg.adam_8bit:
        check_adam_8bit_available()
    # A tracker that is not installed or not logged in stops the run here, not at step 100.
    sinks = check_sinks(parse_report_to(cfg.report_to), registry.sink)
    for flag, folder in (
        ("--save-path", cfg.save_path),
        ("--metrics-log-dir", cfg.metrics_log_dir),
    ):
        if folder:
            check_writable_dir(folder, flag)
    rows = load_training_rows(cfg, spec, registry)
    if agent_fn is None:  # an agent builds its own prompts, bounded by the context length
        check_prompts_fit(rows, cfg, f"--dataset-path {cfg.dataset_path!r}")
    eval_rows = load_eval_rows(cfg, spec, registry) if cfg.eval_dataset_path else None
    resume_from = resolved.resume_from
    if resume_from is not None:
        check_resume_dataset(resume_from, rows, f"--dataset-path {cfg.dataset_path!r}")
        check_resume_adapter(resume_from, LoraSettings.from_config(cfg))
    if cfg.save_path and not cfg.resume:
        earlier = find_latest_checkpoint(cfg.save_path)
        if earlier is not None:
            raise ConfigError(
                f"--save-path {cfg.save_path!r} already holds a run (latest checkpoint "
                f"{earlier.name}); continue it with --resume auto, or start over in a new "
                "--save-path (or after deleting that directory)"
            )
    # Outputs (config.yaml, metrics) go to --save-path, else next to --metrics-log-dir, else
    # to a fresh directory under ./runs.
    if cfg.save_path:
        output_dir = Path(cfg.save_path)
    elif cfg.metrics_log_dir:
        output_dir = Path(cfg.metrics_log_dir)
    else:
        output_dir = Path("runs") / f"{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}"
    metrics_dir = Path(cfg.metrics_log_dir) if cfg.metrics_log_dir else output_dir / "tensorboard"
    return RunPlan(
        resolved,
        cfg,
        spec,
        rows,
        reward_fn,
        agent_fn,
        resume_from,
        output_dir,
        metrics_dir,
        eval_rows,
        sinks,
    )


def check_prompts_fit(rows: list[dict[str, Any]], cfg: RunConfig, source: str) -> None:
    """Fail before training when no row's prompt fits ``--max-prompt-tokens``: every row would
    be skipped and nothing trained. Stops at the first prompt that fits (usually the first)."""
    tokenizer = load_tokenizer(cfg.ckpt)
    shortest = None
    for row in rows:
        length = len(encode_prompt(tokenizer, row["prompt"], disable_thinking=cfg.disable_thinking))
        if length <= cfg.max_prompt_tokens:
            return
        shortest = length if shortest is None else min(shortest, length)
    raise ConfigError(
        f"every prompt of {source} ({len(rows)} rows) is longer than --max-prompt-tokens "
        f"{cfg.max_prompt_tokens} (the shortest has {shortest} tokens), so every row would be "
        f"skipped and nothing trained; raise --max-prompt-tokens to at least {shortest}"
    )


def train_kwargs(resolved: ResolvedRun) -> dict[str, Any]:
    """Keyword arguments of ``backend.train`` from the resolved run (the algorithm's own
    options included)."""
    cfg, spec = resolved.config, resolved.algorithm
    kwargs: dict[str, Any] = {
        "algorithm": spec,
        "learning_rate": cfg.lr,
        "min_lr": cfg.min_lr,
        "lr_decay_steps": cfg.lr_decay_steps,
        "lr_decay_style": cfg.lr_decay_style,
        "adam_betas": (cfg.adam_beta1, cfg.adam_beta2),
        "weight_decay": cfg.weight_decay,
        "adam_8bit": cfg.adam_8bit,
        "grad_clip_norm": cfg.grad_clip_norm,
        "mini_bs": cfg.mini_bs,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "activation_checkpointing": cfg.activation_checkpointing,
        "temperature": 1.0 if cfg.greedy or not spec.needs_rollout else cfg.temperature,
        "max_prompt_tokens": cfg.max_prompt_tokens,
        "max_new_tokens": cfg.max_new_tokens,
        "disable_thinking": cfg.disable_thinking,
    }
    if "critic" in spec.roles:
        kwargs["critic_lr"] = cfg.critic_lr
        kwargs["critic_warmup_steps"] = cfg.critic_warmup_steps
    if cfg.async_rollout:
        kwargs["proximal_logprobs"] = cfg.proximal_logprobs
    kwargs.update(attrs.asdict(resolved.algorithm_config))
    return kwargs


def engine_options(plan: RunPlan, model: TrainableModel) -> EngineOptions:
    """What the run's rollout engine honours, from the core options."""
    cfg = plan.config
    # Later agent turns carry the whole conversation, so their prompts are bounded by the
    # context length rather than --max-prompt-tokens.
    context_limit = cfg.max_context_len or _model_context_len(model)
    return EngineOptions(
        max_running=cfg.max_running_prompts,
        max_prompt_tokens=context_limit if plan.agent_fn else cfg.max_prompt_tokens,
        attn_backend=cfg.attn_backend,
        eager_decode=cfg.eager_decode,
    )


def agent_options(cfg: RunConfig) -> dict[str, Any]:
    """The options of agentic rollouts besides the agent function (``AgentSettings``)."""
    return {
        "train_tool_results": cfg.train_tool_results,
        "max_context_len": cfg.max_context_len,
        "timeout_s": cfg.agent_timeout_s,
        "max_concurrency": cfg.max_running_prompts,
    }


def rollout_settings(cfg: RunConfig) -> dict[str, Any]:
    """How rollouts sample, score and group, the same for the runner in this process and the
    asynchronous worker's (keywords of ``RolloutRunner`` and ``WorkerSpec``)."""
    return {
        "sampling": cfg.rollout.sampling(),
        "n_samples": cfg.n_samples,
        "batch_size": cfg.batch_size,
        "disable_thinking": cfg.disable_thinking,
        "drop_state": cfg.drop_rollout_state,
        "drop_uniform_groups": cfg.drop_uniform_groups,
    }


def build_rollout(
    plan: RunPlan, model: TrainableModel, reward_fn: Any, backend: TrainingBackend
) -> RolloutRunner:
    """The run's one rollout engine (``--rollout-engine``) over the policy, in a runner that
    keeps it in step with the policy and serves training rollouts and evaluation alike. A
    backend of several processes places the rollouts (its ``rollout_placement``)."""
    cfg, resolved = plan.config, plan.resolved
    assert resolved.engine is not None
    placement = backend.rollout_placement(model)
    engine = resolved.engine.create(
        placement.policy, model.tokenizer, engine_options(plan, model), resolved.engine_config
    )
    agent = None
    if plan.agent_fn is not None:
        agent = AgentSettings(plan.agent_fn, **agent_options(cfg))
    return RolloutRunner(
        model,
        engine,
        **rollout_settings(cfg),
        reward_fn=reward_fn,
        agent=agent,
        placement=placement,
        offload_optimizer=cfg.offload_optimizer,
        lora_weights=resolved.engine.lora_weights,
    )


def _model_context_len(model: TrainableModel) -> int:
    config = getattr(model.policy, "config", None)
    return int(getattr(config, "max_position_embeddings", 0) or 32768)


def build_async_rollout(
    plan: RunPlan,
    model: TrainableModel,
    stream: DataStream,
    max_steps: int,
    process: WorkerProcess | None = None,
    resume_state: Mapping[str, Any] | None = None,
) -> AsyncRolloutRunner:
    """The run's asynchronous rollout: a worker with the run's engine, reward and agent
    (``process``: the worker, when the command started it early; see ``runner.boot``;
    ``resume_state``: the rollout state of the checkpoint resumed from)."""
    cfg, resolved = plan.config, plan.resolved
    assert resolved.engine is not None
    total = torch.get_num_threads()
    worker_threads = cfg.rollout_threads or max(1, total // 2)
    on_cpu = model.device.type == "cpu"
    spec = WorkerSpec(
        ckpt=cfg.ckpt,
        device=str(model.device),
        engine=resolved.engine.name,
        engine_options=engine_options(plan, model),
        engine_config=attrs.asdict(resolved.engine_config),
        **rollout_settings(cfg),
        reward_fn=cfg.reward_fn_path,
        reward_ckpt=cfg.reward_ckpt,
        agent_fn=cfg.agent_fn,
        agent_options=agent_options(cfg) if cfg.agent_fn else {},
        threads=worker_threads if on_cpu else None,
        log_level=logging.getLogger("areno").getEffectiveLevel(),
        dtype=str(model.dtype).removeprefix("torch."),
        # As the trainer loaded its policy: flash-attn when it runs it, the default otherwise.
        attn_implementation=FLASH if uses_flash(model.policy) else None,
        max_inflight_batches=cfg.max_inflight_batches if cfg.agent_fn else 1,
    )
    return AsyncRolloutRunner(
        model,
        stream,
        spec,
        max_staleness=cfg.max_staleness,
        max_steps=max_steps,
        agentic=cfg.agent_fn is not None,
        threads=max(1, total - worker_threads) if on_cpu else None,
        process=process,
        step_fill=cfg.step_fill,
        resume_state=resume_state,
    )

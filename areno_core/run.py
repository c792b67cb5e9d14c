"""``areno train`` end to end: check every input, then load, train, log and save.

Order matters: everything that can fail on bad input (algorithm, dataset, loader, rows,
reward/agent files, resume path, optimizer availability) is checked before any model is loaded
or any output directory is created, so a bad command fails fast and leaves nothing behind.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import attrs
import torch
from rich.console import Console

from areno_core.accel.attention import FLASH, attention_of, choose_attention
from areno_core.accel.memory import MemoryMeter, PhaseMemory
from areno_core.accel.precision import resolve_run_dtype
from areno_core.algorithm import AlgorithmSpec
from areno_core.config import RunConfig, dump_yaml
from areno_core.data import (
    apply_loader,
    load_rows,
    resolve_loader,
    split_preference_rows,
    validate_rows,
)
from areno_core.errors import ConfigError, NotAvailableError
from areno_core.log import get_logger
from areno_core.loop import LoopResult, train_loop
from areno_core.model import TrainableModel
from areno_core.models.lora import LoraSettings, check_resume_adapter
from areno_core.registry import Registry, get_registry
from areno_core.resolve import ResolvedRun
from areno_core.rewards import resolve_reward_fn
from areno_core.rollout.base import EngineOptions
from areno_core.rollout.runner import AgentSettings, RolloutPlacement, RolloutRunner
from areno_core.train.checkpoint import (
    check_resume_dataset,
    check_writable_dir,
    find_latest_checkpoint,
)
from areno_core.train.contract import TrainingBackend
from areno_core.train.datastream import DataStream
from areno_core.train.metrics import MetricsLogger
from areno_core.train.optim import check_adam_8bit_available
from areno_core.train.progress import TrainProgress, print_summary
from areno_core.train.sinks import RunInfo, SinkSpec, check_sinks, open_sinks, parse_report_to
from areno_core.types import SamplingParams

logger = get_logger(__name__)
console = Console()


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
    return apply_loader(rows, loader) if loader is not None else rows


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
        from areno_core.agentic.collect import resolve_agent_fn

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
    from areno_core.models.chat import encode_prompt
    from areno_core.models.loading import load_tokenizer

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


def _reward_model_fn(model: TrainableModel, ref: str) -> Any:
    """A reward function scoring each sample with a reward model's last-token value."""
    from areno_core.models.loading import load_value_model

    scorer = load_value_model(
        ref,
        device=str(model.device),
        role="reward",
        dtype=model.dtype,
        attn_implementation=attention_of(model.policy),
    )
    scorer.eval()

    def reward_fn(record: Any) -> float:
        ids = torch.tensor([[*record.prompt_ids, *record.token_ids]], device=model.device)
        with torch.no_grad():
            return float(scorer.score_last(ids, torch.ones_like(ids))[0])

    return reward_fn


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


def sampling_params(cfg: RunConfig) -> SamplingParams:
    """How training rollouts sample (the seed is drawn per step)."""
    return SamplingParams(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        greedy=cfg.greedy,
    )


def agent_options(cfg: RunConfig) -> dict[str, Any]:
    """The options of agentic rollouts besides the agent function (``AgentSettings``)."""
    return {
        "train_tool_results": cfg.train_tool_results,
        "max_context_len": cfg.max_context_len,
        "timeout_s": cfg.agent_timeout_s,
        "max_concurrency": cfg.max_running_prompts,
    }


def build_rollout(
    plan: RunPlan, model: TrainableModel, reward_fn: Any, backend: TrainingBackend | None = None
) -> RolloutRunner:
    """The run's one rollout engine (``--rollout-engine``) over the policy, in a runner that
    keeps it in step with the policy and serves training rollouts and evaluation alike. A
    backend of several processes places the rollouts (its ``rollout_placement``)."""
    cfg, resolved = plan.config, plan.resolved
    assert resolved.engine is not None
    place = getattr(backend, "rollout_placement", None)
    placement = place(model) if place is not None else RolloutPlacement.local(model)
    engine = resolved.engine.create(
        placement.policy, model.tokenizer, engine_options(plan, model), resolved.engine_config
    )
    agent = None
    if plan.agent_fn is not None:
        agent = AgentSettings(plan.agent_fn, **agent_options(cfg))
    return RolloutRunner(
        model,
        engine,
        sampling=sampling_params(cfg),
        n_samples=cfg.n_samples,
        reward_fn=reward_fn,
        batch_size=cfg.batch_size,
        disable_thinking=cfg.disable_thinking,
        drop_state=cfg.drop_rollout_state,
        drop_uniform_groups=cfg.drop_uniform_groups,
        agent=agent,
        placement=placement,
        offload_optimizer=cfg.offload_optimizer,
        lora_weights=resolved.engine.lora_weights,
    )


def run_training(
    resolved: ResolvedRun, *, registry: Registry | None = None, argv: list[str] | None = None
) -> LoopResult | None:
    """Run ``areno train`` with already-resolved options. ``argv`` (the command's arguments)
    lets a backend that trains in processes it starts launch them; the result is then None
    (the workers logged everything)."""
    registry = registry or get_registry()
    plan = plan_run(resolved, registry)
    cfg, spec = plan.config, plan.spec
    if resolved.backend is None:
        raise NotAvailableError("no installed training backend can run this configuration")
    launch = resolved.backend.launch
    if argv is not None and launch is not None and launch(cfg, argv):
        return None
    backend = resolved.backend.factory(cfg, resolved.backend_config, registry)
    # A backend may fix the parameters' dtype itself (FSDP2 keeps float32 and mixes precision).
    model_dtype = getattr(backend, "model_dtype", None)
    dtype = model_dtype(cfg.dtype) if model_dtype else resolve_run_dtype(cfg.dtype, backend.device)
    attention = choose_attention(cfg.attn_backend, backend.device, dtype)
    tuned = None
    if cfg.tune_params:
        tuned = _tune(plan, backend, dtype, attention)
        resolved = tuned.resolved
        plan = attrs.evolve(plan, resolved=resolved, config=resolved.config)
        cfg = plan.config
    torch.manual_seed(cfg.seed)
    model = TrainableModel.from_ckpt(
        cfg.ckpt,
        ref_ckpt=cfg.ref_ckpt,
        critic_ckpt=cfg.critic_ckpt if "critic" in spec.roles else None,
        seed=cfg.seed,
        device=backend.device,
        dtype=dtype,
        attn_implementation=attention if attention == FLASH else None,
        lora=LoraSettings.from_config(cfg),
    )
    kwargs = train_kwargs(resolved)
    backend.setup(model, spec, **_setup_kwargs(kwargs))
    stream = DataStream(plan.rows, cfg.batch_size, seed=cfg.seed, epochs=cfg.epochs)
    if plan.resume_from is not None:
        if spec.uses_reference(resolved.algorithm_config) and cfg.ref_ckpt is None:
            model.ensure_reference()  # the frozen initial policy, before weights are replaced
        state = backend.load_checkpoint(model, plan.resume_from)
        stream.load_state_dict(state["data"])
        logger.info("resumed from %s at step %d", plan.resume_from, model.step)

    main = backend.is_main_process
    if main:
        plan.output_dir.mkdir(parents=True, exist_ok=True)
        dump_yaml(resolved.to_dict(), plan.output_dir / "config.yaml")
        if tuned is not None:
            dump_yaml(tuned.to_dict(), plan.output_dir / "tune.yaml")
    max_steps = min(stream.total_steps, cfg.max_steps or stream.total_steps)
    # A resumed run drops what the old one logged after its checkpoint; a fresh run starts the
    # metrics directory over (purge from step 1), so re-runs never interleave two histories.
    config_dict = resolved.to_dict()
    # Only the main process reports: the other processes of a distributed run open no sink.
    run_info = RunInfo(
        plan.output_dir.name, plan.output_dir, plan.metrics_dir, config_dict, model.step + 1
    )
    metrics = MetricsLogger(None, sinks=open_sinks(plan.sinks, run_info) if main else [])

    def save(step: int) -> str:
        trainer_state = {"data": stream.state_dict()}
        path = backend.save_checkpoint(
            model, cfg.save_path, trainer_state=trainer_state, config=config_dict
        )
        return str(path)

    rollout = evaluate = None
    if plan.eval_rows is not None and not spec.needs_rollout:
        evaluate = build_loss_evaluator(plan, model, backend, kwargs)
    if spec.needs_rollout:
        reward_fn = plan.reward_fn or _reward_model_fn(model, cfg.reward_ckpt)
        rollout = build_rollout(plan, model, reward_fn, backend)
        if plan.eval_rows is not None:
            evaluate = rollout.evaluator(plan.eval_rows, max_new_tokens=cfg.max_new_tokens)
        if cfg.async_rollout:  # rollouts from a worker process; evaluation stays here
            from areno_core.rollout.async_runner import build_async_rollout

            rollout = build_async_rollout(plan, model, stream, max_steps)
    if main:
        lora = ""
        if model.adapter is not None:
            lora = (
                f", LoRA rank {cfg.lora_rank} ({model.adapter.num_trainable():,} trainable "
                "parameters)"
            )
        console.print(
            f"[bold]areno train[/] --algo {cfg.algo}: {len(plan.rows)} rows, {max_steps} steps"
            f"{lora}, outputs in {plan.output_dir}",
            highlight=False,
        )
    try:
        with (
            StopOnInterrupt(saves=bool(cfg.save_path), console=console) as interrupt,
            TrainProgress(max_steps, enabled=main, console=console) as progress,
            rollout if isinstance(rollout, AbstractContextManager) else nullcontext(),
        ):
            result = train_loop(
                model=model,
                backend=backend,
                stream=stream,
                train_kwargs=kwargs,
                max_steps=max_steps,
                rollout=rollout,
                metrics=metrics,
                progress=progress,
                save=save if cfg.save_path else None,
                save_interval=cfg.save_interval,
                evaluate=evaluate,
                eval_interval=cfg.eval_interval,
                stop_requested=_stop_check(backend, interrupt),
                memory=PhaseMemory(MemoryMeter(backend.device)),
            )
        metrics.finish(result.checkpoint_path)
    finally:
        metrics.close()
    if main:
        print_summary(
            console,
            steps=result.steps,
            elapsed_s=result.elapsed_s,
            final_metrics=result.final_metrics,
            checkpoint_path=result.checkpoint_path,
            metrics_dir=str(plan.metrics_dir),
            first_eval=result.first_eval,
            last_eval=result.last_eval,
        )
        if result.interrupted:
            _print_interrupted(result, cfg, max_steps)
    return result


def _stop_check(backend: Any, interrupt: StopOnInterrupt) -> Callable[[], bool]:
    """Whether to stop before the next step. A backend of several processes may agree on it
    (``any_process``), so that they all stop after the same step."""
    agree = getattr(backend, "any_process", None)
    if agree is None:
        return lambda: interrupt.requested
    return lambda: bool(agree(interrupt.requested))


class StopOnInterrupt:
    """Ctrl-C during training: the first press lets the current step finish, saves it (with
    ``--save-path``) and stops; a second press stops at once, saving nothing."""

    def __init__(self, *, saves: bool, console: Console) -> None:
        self.saves = saves
        self.console = console
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        then = "save a checkpoint and stop" if self.saves else "stop (no --save-path: no save)"
        self.console.print(
            f"\n[bold]Interrupted:[/] finishing the current step, then I {then}. "
            "Press Ctrl-C again to abort now.",
            highlight=False,
        )

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def _print_interrupted(result: LoopResult, cfg: RunConfig, max_steps: int) -> None:
    if result.checkpoint_path and cfg.save_path:
        console.print(
            f"Stopped after step {result.steps} of {max_steps}; saved {result.checkpoint_path}. "
            f"Continue with:\n  areno train --resume auto --save-path {cfg.save_path}",
            highlight=False,
        )
    else:
        console.print(
            f"Stopped after step {result.steps} of {max_steps}; nothing was saved (no "
            "--save-path).",
            highlight=False,
        )


def _tune(plan: RunPlan, backend: TrainingBackend, dtype: torch.dtype, attention: str) -> Any:
    """``--tune-params``: probe memory, print what was chosen and why; the tuned outcome."""
    from areno_core.tune import tune_run

    kwargs = train_kwargs(plan.resolved)
    if backend.is_main_process:
        console.print("[bold]--tune-params[/]: probing memory (random weights, synthetic rows)")
    outcome = tune_run(
        plan.resolved,
        backend=backend,
        train_kwargs=kwargs,
        setup_kwargs=_setup_kwargs(kwargs),
        dtype=dtype,
        attention=attention,
    )
    if backend.is_main_process:
        for line in outcome.lines:
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    return outcome


def _model_context_len(model: TrainableModel) -> int:
    config = getattr(model.policy, "config", None)
    return int(getattr(config, "max_position_embeddings", 0) or 32768)


def _setup_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "learning_rate",
        "min_lr",
        "lr_decay_steps",
        "lr_decay_style",
        "adam_betas",
        "weight_decay",
        "adam_8bit",
        "activation_checkpointing",
        "critic_lr",
    )
    return {k: kwargs[k] for k in keys if k in kwargs}

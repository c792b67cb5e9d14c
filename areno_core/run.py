"""``areno train`` end to end: check every input, then load, train, log and save.

Order matters: everything that can fail on bad input (algorithm, dataset, loader, rows,
reward/agent files, resume path, optimizer availability) is checked before any model is loaded
or any output directory is created (:func:`areno_core.wiring.plan_run`), so a bad command fails
fast and leaves nothing behind.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import attrs
import torch
from rich.console import Console

from areno_core.accel.attention import FLASH, choose_attention
from areno_core.accel.memory import MemoryMeter, PhaseMemory
from areno_core.config import RunConfig, dump_yaml
from areno_core.contracts.backend import SETUP_KEYWORDS, TrainingBackend
from areno_core.contracts.sink import RunInfo
from areno_core.data.stream import DataStream
from areno_core.errors import NotAvailableError
from areno_core.log import get_logger
from areno_core.loop import LoopResult, train_loop
from areno_core.metrics.logger import MetricsLogger
from areno_core.metrics.sinks import open_sinks
from areno_core.model import TrainableModel
from areno_core.models.lora import LoraSettings
from areno_core.models.reward import reward_model_beside
from areno_core.registry import Registry, get_registry
from areno_core.resolve import ResolvedRun
from areno_core.runner.boot import WorkerProcess
from areno_core.train.checkpointing import resolve_activation_checkpointing
from areno_core.train.progress import TrainProgress, print_summary
from areno_core.tune import TuneOutcome, tune_run
from areno_core.wiring import (
    RunPlan,
    build_async_rollout,
    build_loss_evaluator,
    build_rollout,
    plan_run,
    train_kwargs,
)

logger = get_logger(__name__)
console = Console()


def run_training(
    resolved: ResolvedRun,
    *,
    registry: Registry | None = None,
    argv: list[str] | None = None,
    rollout_worker: WorkerProcess | None = None,
) -> LoopResult | None:
    """Run ``areno train`` with already-resolved options. ``argv`` (the command's arguments)
    lets a backend that trains in processes it starts launch them; the result is then None
    (the workers logged everything). ``rollout_worker``: the ``--async-rollout`` worker when
    the command started it before loading anything (:mod:`areno_core.runner.boot`); the run
    takes it over, and stops it if it ends first."""
    registry = registry or get_registry()
    plan = plan_run(resolved, registry)
    backend = _open_backend(plan, registry, argv)
    if backend is None:
        return None
    # A backend may fix the parameters' dtype itself (FSDP2 keeps float32 and mixes precision).
    dtype = backend.model_dtype(plan.config.dtype)
    attention = choose_attention(plan.config.attn_backend, backend.device, dtype)
    tuned = None
    if plan.config.tune_params:
        tuned = _tune(plan, backend, dtype, attention)
        plan = attrs.evolve(plan, resolved=tuned.resolved, config=tuned.resolved.config)
    cfg, spec, resolved = plan.config, plan.spec, plan.resolved
    model = _load_model(plan, backend, dtype, attention)
    kwargs = train_kwargs(resolved)
    kwargs["activation_checkpointing"] = resolve_activation_checkpointing(
        cfg.activation_checkpointing,
        model.policy,
        rows=cfg.mini_bs,
        seq_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
        device=backend.device,
        world_size=cfg.world_size or 1,
        tp_size=cfg.tp_size or 1,
    )
    backend.setup(model, spec, **_setup_kwargs(kwargs))
    stream = DataStream(plan.rows, cfg.batch_size, seed=cfg.seed, epochs=cfg.epochs)
    resumed: dict[str, Any] = {}
    if plan.resume_from is not None:
        resumed = _resume(plan, model, backend, stream)
    main = backend.is_main_process
    if main:
        _write_run_files(plan, tuned)
    max_steps = min(stream.total_steps, cfg.max_steps or stream.total_steps)
    config_dict = resolved.to_dict()
    # A resumed run drops what the old one logged after its checkpoint; a fresh run starts the
    # metrics directory over (purge from step 1), so re-runs never interleave two histories.
    # Only the main process reports: the other processes of a distributed run open no sink.
    run_info = RunInfo(
        plan.output_dir.name, plan.output_dir, plan.metrics_dir, config_dict, model.step + 1
    )
    metrics = MetricsLogger(None, sinks=open_sinks(plan.sinks, run_info) if main else [])

    def save(step: int) -> str:
        trainer_state = {"data": stream.state_dict()}
        rollout_state = rollout.state_dict() if hasattr(rollout, "state_dict") else {}
        if rollout_state:  # --step-fill completion: the rows it owes or trained ahead
            trainer_state["rollout"] = rollout_state
        path = backend.save_checkpoint(
            model, cfg.save_path, trainer_state=trainer_state, config=config_dict
        )
        return str(path)

    rollout, evaluate = _rollout_and_evaluation(
        plan, model, backend, kwargs, stream, max_steps, rollout_worker, resumed.get("rollout")
    )
    if main:
        _announce(plan, model, max_steps)
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
                stop_requested=lambda: bool(backend.any_process(interrupt.requested)),
                memory=PhaseMemory(MemoryMeter(backend.device)),
            )
        metrics.finish(result.checkpoint_path)
    finally:
        metrics.close()
    if main:
        _summarize(result, plan, max_steps)
    return result


def _open_backend(
    plan: RunPlan, registry: Registry, argv: list[str] | None
) -> TrainingBackend | None:
    """The run's training backend, or None when the backend launched worker processes that
    run the whole command themselves."""
    backend = plan.resolved.backend
    if backend is None:
        raise NotAvailableError("no installed training backend can run this configuration")
    if argv is not None and backend.launch is not None and backend.launch(plan.config, argv):
        return None
    return backend.factory(plan.config, plan.resolved.backend_config, registry)


def _load_model(
    plan: RunPlan, backend: TrainingBackend, dtype: torch.dtype, attention: str
) -> TrainableModel:
    """The policy (and the reference and critic the algorithm needs), seeded by ``--seed``."""
    cfg = plan.config
    torch.manual_seed(cfg.seed)
    return TrainableModel.from_ckpt(
        cfg.ckpt,
        ref_ckpt=cfg.ref_ckpt,
        critic_ckpt=cfg.critic_ckpt if "critic" in plan.spec.roles else None,
        seed=cfg.seed,
        device=backend.device,
        dtype=dtype,
        attn_implementation=attention if attention == FLASH else None,
        lora=LoraSettings.from_config(cfg),
    )


def _resume(
    plan: RunPlan, model: TrainableModel, backend: TrainingBackend, stream: DataStream
) -> dict[str, Any]:
    """Load the checkpoint resumed from; its trainer state (the data position, and the
    rollout side's state when it saved one)."""
    assert plan.resume_from is not None
    if plan.spec.uses_reference(plan.resolved.algorithm_config) and plan.config.ref_ckpt is None:
        model.ensure_reference()  # the frozen initial policy, before weights are replaced
    state = backend.load_checkpoint(model, plan.resume_from)
    stream.load_state_dict(state["data"])
    logger.info("resumed from %s at step %d", plan.resume_from, model.step)
    return dict(state)


def _write_run_files(plan: RunPlan, tuned: TuneOutcome | None) -> None:
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(plan.resolved.to_dict(), plan.output_dir / "config.yaml")
    if tuned is not None:
        dump_yaml(tuned.to_dict(), plan.output_dir / "tune.yaml")


def _rollout_and_evaluation(
    plan: RunPlan,
    model: TrainableModel,
    backend: TrainingBackend,
    kwargs: dict[str, Any],
    stream: DataStream,
    max_steps: int,
    rollout_worker: WorkerProcess | None = None,
    rollout_state: Mapping[str, Any] | None = None,
) -> tuple[Any, Callable[[], dict[str, float]] | None]:
    """The rollout side of an online run (None otherwise) and the held-out evaluation (None
    without ``--eval-dataset-path``)."""
    cfg, spec = plan.config, plan.spec
    if not spec.needs_rollout:
        if plan.eval_rows is None:
            return None, None
        return None, build_loss_evaluator(plan, model, backend, kwargs)
    reward_fn = plan.reward_fn
    if reward_fn is None:
        assert cfg.reward_ckpt is not None, "plan_run checks that one of them is given"
        reward_fn = reward_model_beside(model, cfg.reward_ckpt)
    rollout: Any = build_rollout(plan, model, reward_fn, backend)
    evaluate = None
    if plan.eval_rows is not None:
        evaluate = rollout.evaluator(plan.eval_rows, max_new_tokens=cfg.max_new_tokens)
    if cfg.async_rollout:  # rollouts from a worker process; evaluation stays here
        rollout = build_async_rollout(
            plan, model, stream, max_steps, process=rollout_worker, resume_state=rollout_state
        )
    return rollout, evaluate


def _announce(plan: RunPlan, model: TrainableModel, max_steps: int) -> None:
    cfg = plan.config
    lora = ""
    if model.adapter is not None:
        lora = (
            f", LoRA rank {cfg.lora_rank} ({model.adapter.num_trainable():,} trainable parameters)"
        )
    console.print(
        f"[bold]areno train[/] --algo {cfg.algo}: {len(plan.rows)} rows, {max_steps} steps"
        f"{lora}, outputs in {plan.output_dir}",
        highlight=False,
    )


def _summarize(result: LoopResult, plan: RunPlan, max_steps: int) -> None:
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
        _print_interrupted(result, plan.config, max_steps)


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


def _tune(
    plan: RunPlan, backend: TrainingBackend, dtype: torch.dtype, attention: str
) -> TuneOutcome:
    """``--tune-params``: probe memory, print what was chosen and why; the tuned outcome."""
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


def _setup_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in SETUP_KEYWORDS if k in kwargs}

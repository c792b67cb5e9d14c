"""Starting the worker processes of ``areno train --world-size N`` on this machine.

The command checks everything cheap first (options, dataset, rewards, the tensor-parallel
plan), then hands the same command line to torch's elastic launcher (the machinery behind
``torchrun``), which starts ``N`` workers running ``python -m areno_core.cli train ...`` with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. A worker
sees those variables and trains instead of launching. ``torchrun ... -m areno_core.cli train``
starts the very same workers, on one machine or several.

When a worker fails (an exception, or killed by a signal) the launcher stops the others and
:func:`launch_workers` raises :class:`WorkersFailed` naming the rank and its error. A worker's
traceback goes to ``<run>/logs/rank<N>.log`` (:func:`log_worker_traceback`), not to the
terminal: when one rank dies, the others fail in their next collective with long gloo or NCCL
tracebacks that only bury the one line that says what happened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from areno_core.errors import ArenoError, ConfigError
from areno_core.log import get_logger
from areno_core.train.distributed.context import launched_world_size
from areno_core.train.distributed.parallelize import check_tp_support

logger = get_logger(__name__)

# How often the launcher looks at its workers (seconds): bounds how long a run takes to stop
# after a worker died.
MONITOR_INTERVAL_S = 0.2

# Where the workers started by launch_workers write their tracebacks (set for them by the
# launcher; a worker of a plain torchrun launch has none and lets Python print its traceback).
WORKER_LOG_ENV = "ARENO_WORKER_LOG_DIR"


class WorkersFailed(ArenoError):
    """A worker process of a distributed run failed; the others were stopped."""


def in_worker() -> bool:
    """Whether this process is a worker started by torch's launcher (torchrun or areno)."""
    return launched_world_size() is not None


def launch_workers(config: Any, argv: Sequence[str]) -> bool:
    """Run ``areno *argv`` (e.g. ``train --world-size 2 ...``) in ``config.world_size`` worker
    processes on this machine and wait for them. Returns False (doing nothing) in a worker,
    or for a world of one, which trains in the calling process."""
    if in_worker() or config.world_size == 1:
        return False
    check_launch(config)
    nproc = int(config.world_size)
    if "OMP_NUM_THREADS" not in os.environ:
        # Workers share this machine's cores; without a limit each would start one thread
        # per core and they would slow each other down.
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    log_dir = worker_log_dir(config)
    from torch.distributed.elastic.multiprocessing.api import (
        SignalException,  # heavy: distributed work only
    )
    from torch.distributed.elastic.multiprocessing.errors import (
        ChildFailedError,  # heavy: distributed work only
    )
    from torch.distributed.launcher.api import (  # heavy: distributed work only
        LaunchConfig,
        elastic_launch,
    )

    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"areno-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=MONITOR_INTERVAL_S,
        start_method="spawn",
    )
    logger.info("starting %d worker processes", nproc)
    try:
        with _env(WORKER_LOG_ENV, str(log_dir.resolve())), _quiet_launcher():
            elastic_launch(launch, sys.executable)("-m", "areno_core.cli", *argv)
    except ChildFailedError as exc:
        raise WorkersFailed(describe_failure(exc.failures, log_dir=log_dir)) from None
    except SignalException as exc:
        # The launcher passed the signal on to the workers (Ctrl-C: they finish the step,
        # save and stop; see StopOnInterrupt) and waited for them.
        if exc.sigval == signal.SIGINT:
            raise SystemExit(130) from None
        raise WorkersFailed(
            f"the launcher got {signal.Signals(exc.sigval).name} and stopped the workers"
        ) from None
    return True


def worker_log_dir(config: Any) -> Path:
    """Where the workers of a run leave their tracebacks: ``logs/`` in the run's directory
    (``--save-path``, else ``--metrics-log-dir``), else ``runs/logs``."""
    return Path(config.save_path or config.metrics_log_dir or "runs") / "logs"


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[None]:
    """torch's launcher logs each process it stops and each failure on its own lines; the
    run's one error line (:func:`describe_failure`) says the same, so they are held back."""
    elastic = logging.getLogger("torch.distributed.elastic")
    level = elastic.level
    elastic.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        elastic.setLevel(level)


def log_worker_traceback(exc: BaseException) -> Path | None:
    """In a worker started by :func:`launch_workers`, append ``exc``'s traceback to
    ``rank<N>.log`` in the run's log directory and return that file; None elsewhere (or when
    it cannot be written: the caller then lets the traceback print)."""
    folder = os.environ.get(WORKER_LOG_ENV)
    if not folder or not in_worker():
        return None
    rank = os.environ.get("RANK", "0")
    path = Path(folder) / f"rank{rank}.log"
    header = f"--- rank {rank}, pid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    text = header + "".join(traceback.format_exception(exc))
    try:
        with _sigterm_held():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(text)
    except OSError:
        return None
    return path


@contextlib.contextmanager
def _sigterm_held() -> Iterator[None]:
    """The launcher stops the surviving workers with SIGTERM as soon as it sees a failed one;
    held back for a write, it ends this process right after the write instead of during it."""
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def cpu_oversubscription(world_size: int, cores: int) -> str | None:
    """A warning when ``world_size`` processes would share fewer CPU ``cores`` (one thread
    each, taking turns), else None."""
    if world_size <= cores:
        return None
    return (
        f"--world-size {world_size} starts {world_size} worker processes on this machine's "
        f"{cores} CPU core(s): they take turns on the cores, one thread each, so each step is "
        f"slower than with --world-size {cores} or fewer (several processes on one CPU are "
        "for testing the distributed path, not for speed; see docs/distributed.md)"
    )


def check_launch(config: Any) -> None:
    """What must hold before any worker starts: enough GPUs on a GPU machine, and a
    tensor-parallel plan for the model when ``--tp-size`` > 1. More processes than CPU cores
    on a machine without a GPU is allowed, with a warning."""

    if torch.cuda.is_available() and config.world_size > torch.cuda.device_count():
        raise ConfigError(
            f"--world-size {config.world_size}: this machine has {torch.cuda.device_count()} "
            "GPU(s), one per process; start the other processes on more machines with torchrun "
            "(see docs/distributed.md)"
        )
    if not torch.cuda.is_available():
        warning = cpu_oversubscription(int(config.world_size), os.cpu_count() or 1)
        if warning is not None:
            logger.warning("%s", warning)
    if config.tp_size > 1:
        check_tp_support(model_config(config.ckpt), config.tp_size, what=f"--ckpt {config.ckpt}")


def model_config(ref: str) -> Any:
    """The Hugging Face config of a model reference, without loading weights."""
    from areno_core.models.loading import _load_config  # heavy: transformers, for --tp-size
    from areno_core.models.scratch import build_random_config, is_random_ref  # heavy, as above

    if is_random_ref(ref):
        return build_random_config(ref)

    return _load_config(ref)


def describe_failure(failures: dict[int, Any], *, log_dir: Path | None = None) -> str:
    """One message for a failed run: the first failure's rank and error (the launcher stops
    the other processes, which then fail too; they are only counted), and where the workers'
    tracebacks are when ``log_dir`` holds any."""
    if not failures:
        return "a worker process failed"

    # The launcher stops the other processes with SIGTERM: those are consequences, not causes.
    # A process killed by another signal (SIGKILL, SIGSEGV) is a cause: the others then fail
    # in their next collective with an error of their own, perhaps a moment earlier.
    def order(item: tuple[int, Any]) -> tuple[bool, bool, float, int]:
        code = item[1].exitcode
        killed = code is not None and code < 0 and code != -signal.SIGTERM
        return (code == -signal.SIGTERM, not killed, item[1].timestamp, item[0])

    ordered = sorted(failures.items(), key=order)
    rank, first = ordered[0]
    found = log_dir.glob("rank*.log") if log_dir is not None and log_dir.is_dir() else []
    logs = [p for p in found if p.stat().st_size > 0]
    text = f"the distributed run stopped: {_one_failure(rank, first, logged=bool(logs))}"
    if len(ordered) > 1:
        text += f" ({len(ordered) - 1} other process(es) stopped with it)"
    if logs:
        text += f"; the workers' tracebacks are in {log_dir}"
    return text


def _one_failure(rank: int, failure: Any, *, logged: bool = False) -> str:
    code = failure.exitcode
    if code is not None and code < 0:
        return f"rank {rank} was killed by signal {failure.signal_name()}"
    message = failure.message
    if isinstance(message, dict):  # the error file's record: {"message": ..., "extraInfo": ...}
        message = message.get("message", "")
    message = str(message or "").strip()
    if not message or message.startswith("To enable traceback"):
        where = "in its log" if logged else "printed above"
        return f"rank {rank} exited with code {code} (its error is {where})"
    return f"rank {rank} failed (exit code {code}): {message}"


def record_worker_error(exc: BaseException) -> None:
    """In a worker started by torch's launcher, leave ``exc`` where the launcher reports it."""
    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import (
            ErrorHandler,  # heavy: distributed work only
        )

        ErrorHandler().record_exception(exc)
    except Exception:  # reporting must never hide the error itself
        logger.debug("could not record the error for the launcher", exc_info=True)

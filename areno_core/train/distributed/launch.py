"""Starting the worker processes of ``areno train --world-size N`` on this machine.

The command checks everything cheap first (options, dataset, rewards, the tensor-parallel
plan), then hands the same command line to torch's elastic launcher (the machinery behind
``torchrun``), which starts ``N`` workers running ``python -m areno_core.cli train ...`` with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set. A worker
sees those variables and trains instead of launching. ``torchrun ... -m areno_core.cli train``
starts the very same workers, on one machine or several.

When a worker fails (an exception, or killed by a signal) the launcher stops the others and
:func:`launch_workers` raises :class:`WorkersFailed` naming the rank and its error.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from areno_core.errors import ArenoError, ConfigError
from areno_core.log import get_logger
from areno_core.train.distributed.context import launched_world_size

logger = get_logger(__name__)

# How often the launcher looks at its workers (seconds): bounds how long a run takes to stop
# after a worker died.
MONITOR_INTERVAL_S = 0.2


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
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

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
        elastic_launch(launch, sys.executable)("-m", "areno_core.cli", *argv)
    except ChildFailedError as exc:
        raise WorkersFailed(describe_failure(exc.failures)) from None
    except SignalException as exc:
        # The launcher passed the signal on to the workers (Ctrl-C: they finish the step,
        # save and stop; see StopOnInterrupt) and waited for them.
        if exc.sigval == signal.SIGINT:
            raise SystemExit(130) from None
        raise WorkersFailed(
            f"the launcher got {signal.Signals(exc.sigval).name} and stopped the workers"
        ) from None
    return True


def check_launch(config: Any) -> None:
    """What must hold before any worker starts: enough GPUs on a GPU machine, and a
    tensor-parallel plan for the model when ``--tp-size`` > 1."""
    import torch

    if torch.cuda.is_available() and config.world_size > torch.cuda.device_count():
        raise ConfigError(
            f"--world-size {config.world_size}: this machine has {torch.cuda.device_count()} "
            "GPU(s), one per process; start the other processes on more machines with torchrun "
            "(see docs/distributed.md)"
        )
    if config.tp_size > 1:
        from areno_core.train.distributed.parallelize import check_tp_support

        check_tp_support(model_config(config.ckpt), config.tp_size, what=f"--ckpt {config.ckpt}")


def model_config(ref: str) -> Any:
    """The Hugging Face config of a model reference, without loading weights."""
    from areno_core.models.scratch import build_random_config, is_random_ref

    if is_random_ref(ref):
        return build_random_config(ref)
    from areno_core.models.loading import _load_config

    return _load_config(ref)


def describe_failure(failures: dict[int, Any]) -> str:
    """One message for a failed run: the first failure's rank and error (the launcher stops
    the other processes, which then fail too; they are only counted)."""
    if not failures:
        return "a worker process failed"
    # The launcher stops the other processes with SIGTERM: those are consequences, not causes.
    ordered = sorted(
        failures.items(),
        key=lambda item: (item[1].exitcode == -signal.SIGTERM, item[1].timestamp, item[0]),
    )
    rank, first = ordered[0]
    text = f"the distributed run stopped: {_one_failure(rank, first)}"
    if len(ordered) > 1:
        text += f" ({len(ordered) - 1} other process(es) stopped with it)"
    return text


def _one_failure(rank: int, failure: Any) -> str:
    code = failure.exitcode
    if code is not None and code < 0:
        return f"rank {rank} was killed by signal {failure.signal_name()}"
    message = failure.message
    if isinstance(message, dict):  # the error file's record: {"message": ..., "extraInfo": ...}
        message = message.get("message", "")
    message = str(message or "").strip()
    if not message or message.startswith("To enable traceback"):
        return f"rank {rank} exited with code {code} (its error is printed above)"
    return f"rank {rank} failed (exit code {code}): {message}"


def record_worker_error(exc: BaseException) -> None:
    """In a worker started by torch's launcher, leave ``exc`` where the launcher reports it."""
    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
    except Exception:  # reporting must never hide the error itself
        logger.debug("could not record the error for the launcher", exc_info=True)

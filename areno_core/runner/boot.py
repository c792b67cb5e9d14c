"""Start the ``--async-rollout`` worker process before the run has loaded anything.

The worker spends most of its start importing torch, transformers and areno's model stack.
``areno train`` starts it as soon as the run's options are resolved, with
:meth:`WorkerProcess.spawn`: the new process imports all of that while the trainer imports and
loads its own model. The trainer sends the :class:`~areno_core.runner.worker.WorkerSpec` once
it has built it; only then does the worker load its policy, engine, reward and agent
(:class:`~areno_core.runner.async_rollout.AsyncRolloutRunner` takes the process over).

This module imports nothing heavy, so the command can start the worker before its own heavy
imports.
"""

from __future__ import annotations

import signal
from multiprocessing.connection import Connection
from typing import Any


class WorkerProcess:
    """A spawned rollout worker that waits for its spec (see the module docstring).

    ``to_worker`` and ``from_worker`` are the trainer's ends of the two one-way pipes; the
    worker holds the other ends only, so either side's exit closes them.
    """

    def __init__(self, process: Any, to_worker: Connection, from_worker: Connection) -> None:
        self.process = process
        self.to_worker = to_worker
        self.from_worker = from_worker

    @classmethod
    def spawn(cls) -> WorkerProcess:
        """Start a worker process that imports its stack, then waits for a spec."""
        import torch.multiprocessing as mp  # shares tensors through pipes; torch is loaded

        ctx = mp.get_context("spawn")
        worker_in, to_worker = ctx.Pipe(duplex=False)
        from_worker, worker_out = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=boot_main,
            args=(worker_in, worker_out),
            name="areno-rollout-worker",
            daemon=True,
        )
        process.start()
        worker_in.close()
        worker_out.close()
        return cls(process, to_worker, from_worker)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.exitcode is None

    def close(self) -> None:
        """Stop the process if nobody took it over (closing the pipes ends a waiting worker;
        one still importing is terminated)."""
        process, self.process = self.process, None
        if process is None:
            return
        self.to_worker.close()
        self.from_worker.close()
        process.join(timeout=2)
        if process.is_alive():
            process.terminate()
            process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=10)


def boot_main(inbox: Connection, outbox: Connection) -> None:
    """Entry point of the early-started worker: import, wait for the spec, then serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    from areno_core.runner.worker import (  # heavy: the worker's stack
        PIPE_CLOSED_ERRORS,
        WorkerSpec,
        worker_main,
    )

    try:
        spec = inbox.recv()
    except PIPE_CLOSED_ERRORS:
        return  # the run stopped before it needed the worker
    if not isinstance(spec, WorkerSpec):
        raise TypeError(f"the rollout worker expected its WorkerSpec first, got {spec!r}")
    worker_main(spec, inbox, outbox)


__all__ = ["WorkerProcess", "boot_main"]

"""Colocated mode: start an SGLang server next to the trainer, on the trainer's GPU.

The server is ``python -m sglang.launch_server`` in a child process, bound to 127.0.0.1 on a
free port, seeing only this process's GPU. It loads the policy from a directory areno writes
(token ids in and out: ``--skip-tokenizer-init``, so no tokenizer is loaded there) and runs with
``--enable-memory-saver``, so ``/release_memory_occupation`` can hand its weights and KV cache
back to training between rollout phases. The process is stopped when the engine closes or the
trainer exits.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path

from areno_core.log import get_logger
from areno_sglang.weights import free_port

logger = get_logger(__name__)

LAUNCH_MODULE = "sglang.launch_server"


def server_command(
    model_dir: str,
    port: int,
    *,
    mem_fraction: float,
    extra_args: str | None = None,
    eager: bool = False,
    module: str = LAUNCH_MODULE,
    seed: int = 0,
) -> list[str]:
    """The command line of a colocated server."""
    cmd = [
        sys.executable,
        "-m",
        module,
        "--model-path",
        model_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--skip-tokenizer-init",
        "--enable-memory-saver",
        "--mem-fraction-static",
        f"{mem_fraction:g}",
        "--random-seed",
        str(seed),
    ]
    if eager:
        cmd.append("--disable-cuda-graph")
    if extra_args:
        cmd += shlex.split(extra_args)
    return cmd


class LaunchedServer:
    """A server process this trainer started; :meth:`stop` (or exit) ends it."""

    def __init__(self, command: Sequence[str], port: int, *, env: dict[str, str]) -> None:
        self.command = list(command)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (kept open for the process)
            prefix="areno-sglang-server-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)
        logger.info("sglang: starting %s (log: %s)", " ".join(self.command), self.log_path)
        self.process = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        # Runs on stop(), when the object is collected, or at interpreter exit.
        self._finalizer = weakref.finalize(self, _terminate, self.process, self._log)

    def exited(self) -> str | None:
        """Why the server is gone (with the end of its log), or None while it runs."""
        code = self.process.poll()
        if code is None:
            return None
        self._log.flush()
        tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
        return f"exited with code {code} before answering /health; its log ends:\n" + "\n".join(
            tail
        )

    def stop(self) -> None:
        self._finalizer()


def _terminate(process: subprocess.Popen[bytes], log: object) -> None:
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    close = getattr(log, "close", None)
    if callable(close):
        close()


def launch_colocated(
    model_dir: str,
    *,
    mem_fraction: float,
    extra_args: str | None,
    eager: bool,
    module: str = LAUNCH_MODULE,
    device_index: int | None = None,
) -> LaunchedServer:
    """Start a server for ``model_dir`` on this process's GPU (``device_index``, default the
    current CUDA device) at a free local port."""
    env = dict(os.environ)
    if device_index is not None:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        ids = [d.strip() for d in visible.split(",")] if visible else None
        env["CUDA_VISIBLE_DEVICES"] = ids[device_index] if ids else str(device_index)
    port = free_port()
    command = server_command(
        model_dir, port, mem_fraction=mem_fraction, extra_args=extra_args, eager=eager,
        module=module,
    )  # fmt: skip
    return LaunchedServer(command, port, env=env)

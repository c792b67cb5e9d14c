"""Run model-written Python in a throw-away subprocess; shared by the coding reward and agent.

    result = run_python("print(sum(range(10)))", timeout_s=5)
    result.stdout            # "45\n"
    result = run_python(solution_code, tests="assert add(1, 2) == 3")
    result.passed            # True only when the code and then every test ran without error

Each call gets a fresh temporary directory (its working directory, removed afterwards) and a
child ``python -I`` (isolated mode: no user site-packages, no ``PYTHON*`` variables, the
working directory not on ``sys.path``) with a minimal environment. Before the code runs, the
child caps its own CPU time, memory and file sizes, and replaces the socket constructors so
that opening a network connection raises ``OSError``. On timeout the whole process group is
killed. ``passed`` is decided by a random marker that the child prints through a saved copy of
its stdout only after the tests finished, so code that exits early (``sys.exit(0)``,
``os._exit(0)``) does not pass.

This is best-effort isolation for a training example, not a security boundary: the code runs
as your user, can read what your user can read, and can reach the network through lower-level
modules. Run untrusted model code inside a container or VM with networking disabled.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 5.0
MEMORY_LIMIT_BYTES = 1 << 30  # 1 GiB of address space
MAX_FILE_BYTES = 1 << 20  # files the code writes stay under 1 MiB
MAX_OUTPUT_CHARS = 4000  # kept of stdout and of stderr each

# Runs in the child, before the model's code. argv: solution file, tests file (or ""),
# CPU seconds. The first stdin line is the marker to print when everything passed.
_RUNNER = r"""
import os, resource, socket, sys

def _limit(kind, value):
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass

_limit(resource.RLIMIT_CPU, int(sys.argv[3]))
_limit(resource.RLIMIT_AS, MEMORY_LIMIT)
_limit(resource.RLIMIT_FSIZE, FILE_LIMIT)
_limit(resource.RLIMIT_CORE, 0)

def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in this sandbox")

class _NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        _no_network()

socket.socket = _NoSocket
socket.create_connection = _no_network
socket.getaddrinfo = _no_network

_marker = sys.stdin.readline().strip()
sys.stdin = open(os.devnull)
_out = os.dup(1)
_namespace = {"__name__": "__main__"}
try:
    for _path, _name in ((sys.argv[1], "solution.py"), (sys.argv[2], "tests.py")):
        if _path:
            with open(_path, encoding="utf-8") as _fh:
                exec(compile(_fh.read(), _name, "exec"), _namespace)
except SystemExit:
    raise
except BaseException as _exc:  # report without this runner's own frame
    import traceback
    traceback.print_exception(type(_exc), _exc, _exc.__traceback__.tb_next)
    sys.exit(1)
sys.stdout.flush()
os.write(_out, ("\n" + _marker + "\n").encode())
"""


@dataclass(frozen=True)
class RunResult:
    """What one run produced. ``returncode`` is None when it timed out."""

    passed: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool

    def describe(self) -> str:
        """A short report for a tool message: exit status, then stdout and stderr."""
        status = "timed out" if self.timed_out else f"exit code {self.returncode}"
        parts = [status]
        if self.stdout:
            parts.append(f"stdout:\n{self.stdout}")
        if self.stderr:
            parts.append(f"stderr:\n{self.stderr}")
        return "\n".join(parts)


def run_python(
    code: str, tests: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> RunResult:
    """Run ``code`` (then ``tests`` in the same namespace, when given) in a fresh subprocess.

    Never raises for anything the code does; a code string that cannot be written at all (not
    text) raises ``TypeError``.
    """
    if not isinstance(code, str) or not (tests is None or isinstance(tests, str)):
        raise TypeError("code and tests must be strings")
    marker = secrets.token_hex(16)
    runner = _RUNNER.replace("MEMORY_LIMIT", str(MEMORY_LIMIT_BYTES)).replace(
        "FILE_LIMIT", str(MAX_FILE_BYTES)
    )
    with tempfile.TemporaryDirectory(prefix="areno-coding-") as tmp:
        work = Path(tmp)
        (work / "runner.py").write_text(runner, encoding="utf-8")
        (work / "solution.py").write_text(code, encoding="utf-8")
        tests_arg = ""
        if tests is not None:
            (work / "tests.py").write_text(tests, encoding="utf-8")
            tests_arg = str(work / "tests.py")
        argv = [
            sys.executable,
            "-I",
            str(work / "runner.py"),
            str(work / "solution.py"),
            tests_arg,
            str(max(1, int(timeout_s) + 1)),
        ]
        env = {"PATH": os.defpath, "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
        proc = subprocess.Popen(
            argv,
            cwd=tmp,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills children too
        )
        try:
            out, err = proc.communicate(marker.encode() + b"\n", timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a grandchild escaped the group and holds a pipe
                out, err = b"", b""
            timed_out = True
    stdout = out.decode("utf-8", "replace")
    passed = not timed_out and proc.returncode == 0 and marker in stdout
    stdout = stdout.replace(f"\n{marker}\n", "")
    return RunResult(
        passed=passed,
        returncode=None if timed_out else proc.returncode,
        stdout=_clip(stdout),
        stderr=_clip(err.decode("utf-8", "replace")),
        timed_out=timed_out,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _clip(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[: MAX_OUTPUT_CHARS // 2] + "\n...[truncated]...\n" + text[-MAX_OUTPUT_CHARS // 2 :]

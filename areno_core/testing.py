"""Test helpers for areno and for plugin authors (loaded as a pytest plugin).

Fixtures:

``install_areno_plugin``
    ``install_areno_plugin(dist_name, module_name, source, version="0.0.1")`` writes a real
    distribution (a module plus a ``.dist-info`` with an ``areno`` entry point) into a temporary
    directory on ``sys.path`` and returns a fresh :class:`~areno_core.registry.Registry` that
    sees it. The process-wide registry is reset afterwards.
``areno_registry``
    A fresh registry of the installed plugins, also set as the process-wide one.
``installed_plugins_only``
    Unsets ``ARENO_PLUGINS`` and resets the process-wide registry before and after the test,
    so it sees exactly the installed plugins (use it with ``pytest.mark.usefixtures``).
``agentic_steps``
    A list that gets ``(server, groups)`` for every agentic rollout step the test's run takes:
    the :class:`~areno_core.agentic.server.AgentServer` that served the step (its ``records``
    hold what it served) and the trajectory groups collected from it.
``one_torch_thread``
    Torch on one thread for a module's tests (tiny models run far faster on one thread than
    with OpenMP threads spin-waiting for each other on a shared CPU); the thread count comes
    back afterwards.
``no_deprecated_transformers_api``
    Fails the test when ``transformers`` logs that something the test ran is deprecated (some
    deprecations are log lines, not warnings; the warnings are errors through the
    ``filterwarnings`` setting in pyproject.toml).

Functions:

``run_areno(*argv)``
    Run the ``areno`` command in this process and fail the test unless it exits 0.
``areno_exit_code(*argv)``
    Run the ``areno`` command in this process and return its exit status (the test reads
    stdout and stderr with ``capsys``).

Markers: tests marked ``gpu`` are skipped, with the reason, on a machine where torch sees no
CUDA GPU.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from areno_core.plugins import get_plugin_manager
from areno_core.registry import Registry, set_registry


def write_distribution(
    root: Path,
    dist_name: str,
    module_name: str,
    source: str,
    *,
    version: str = "0.0.1",
    entry_point_name: str | None = None,
    entry_point_object: str | None = None,
    extra_files: dict[str, str] | None = None,
) -> None:
    """Write an importable module and its ``.dist-info`` (with an areno entry point) to root.
    The entry point names the module, or ``entry_point_object`` in it (``module:PACK``)."""
    module_dir = root / module_name
    module_dir.mkdir(parents=True, exist_ok=True)
    (module_dir / "__init__.py").write_text(textwrap.dedent(source))
    for rel, text in (extra_files or {}).items():
        path = module_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    info = root / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
    )
    target = module_name if entry_point_object is None else f"{module_name}:{entry_point_object}"
    (info / "entry_points.txt").write_text(
        f"[areno]\n{entry_point_name or module_name} = {target}\n"
    )
    (info / "top_level.txt").write_text(module_name + "\n")


def areno_exit_code(*argv: str) -> int:
    """Run ``areno *argv`` in-process and return its exit status (0 when it returns)."""
    # pytest loads this plugin in every session; the CLI only when a test runs it
    from areno_core.cli.main import main

    try:
        main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def run_areno(*argv: str) -> None:
    """Run ``areno *argv`` in-process; a non-zero exit fails the calling test."""
    code = areno_exit_code(*argv)
    assert code == 0, f"areno {' '.join(argv)} exited {code}"


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    import torch  # heavy: only for the tests that ask for one thread

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def agentic_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, list[Any]]]:
    import areno_core.agentic.collect as collect_module  # heavy (torch): only agentic e2e tests
    import areno_core.runner.rollout as rollout_module  # heavy (torch): only agentic e2e tests

    steps: list[tuple[Any, list[Any]]] = []
    servers: list[Any] = []
    real_server, real_collect = collect_module.AgentServer, collect_module.collect_agentic_groups

    class Server(real_server):  # type: ignore[misc, valid-type]
        def start(self) -> Any:
            servers.append(self)
            return super().start()

    def collect(*args: Any, **kwargs: Any) -> Any:
        groups, metrics = real_collect(*args, **kwargs)
        steps.append((servers[-1], groups))
        return groups, metrics

    monkeypatch.setattr(collect_module, "AgentServer", Server)
    monkeypatch.setattr(rollout_module, "collect_agentic_groups", collect)  # where the run calls it
    return steps


@pytest.fixture
def installed_plugins_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("ARENO_PLUGINS", raising=False)
    set_registry(None)
    yield
    set_registry(None)


@pytest.fixture
def areno_registry() -> Iterator[Registry]:
    registry = Registry(get_plugin_manager())
    set_registry(registry)
    yield registry
    set_registry(None)


@pytest.fixture
def install_areno_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Registry]]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    installed: list[str] = []

    def install(
        dist_name: str, module_name: str, source: str, version: str = "0.0.1", **kw: object
    ) -> Registry:
        write_distribution(root, dist_name, module_name, source, version=version, **kw)  # type: ignore[arg-type]
        installed.append(module_name)
        registry = Registry(get_plugin_manager())
        set_registry(registry)
        return registry

    yield install
    set_registry(None)
    for name in installed:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            sys.modules.pop(module, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests where torch sees no CUDA GPU."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_tests:
        return
    import torch  # pytest loads this plugin in every session: torch only when GPU tests are

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none)")
    for item in gpu_tests:
        item.add_marker(skip)


class _DeprecationLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "deprecated" in message.lower():
            self.messages.append(message)


@pytest.fixture
def no_deprecated_transformers_api() -> Iterator[None]:
    # transformers logs some deprecations once per process (a cached warning_once): forget
    # what was logged before, so this test sees its own.
    once = getattr(logging.Logger, "warning_once", None)
    if hasattr(once, "cache_clear"):
        once.cache_clear()
    handler = _DeprecationLog()
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    try:
        yield
    finally:
        library.removeHandler(handler)
    assert not handler.messages, "transformers logged deprecations: " + " | ".join(
        sorted(set(handler.messages))
    )

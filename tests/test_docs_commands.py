"""The commands and snippets the docs show run, and the errors they quote are the real ones.

Every ``$ areno train ...`` line of a ``console`` block in docs/, the README and the plugin
READMEs is checked (a command written with ``...`` is an outline, not a command):

- a command followed by an ``Error: ...`` line must fail with exactly that error (the docs'
  line breaks aside);
- a ``--list-recipes`` or ``--help`` command must run as written;
- a ``--dry-run`` command, and one that needs what a CPU test cannot have (a hub model or
  dataset), must resolve with ``--dry-run``;
- any other command is cheap (a random model, local rows) and trains for 2 steps
  (``--max-steps 2``, its outputs in a temporary folder) and must log those 2 steps.

A page whose commands need files or plugins gets them from :data:`PAGE_SETUP`; a page with
commands and no setup runs them from an empty folder with the repository's ``data/`` and
``examples/`` beside it. The Python API snippets of the README and docs/python-api.md run as
written, from an empty folder.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from areno_core.cli.main import main
from areno_core.registry import set_registry

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

pytestmark = pytest.mark.usefixtures("installed_plugins_only")


@attrs.frozen
class DocCommand:
    page: str
    argv: tuple[str, ...]  # after "areno"
    output: tuple[str, ...]

    @property
    def error(self) -> str | None:
        """The documented error, its wrapped lines joined."""
        lines = list(self.output)
        starts = [i for i, line in enumerate(lines) if line.startswith("Error: ")]
        if not starts:
            return None
        return " ".join(line.strip() for line in lines[starts[0] :] if line.strip())

    def option(self, name: str) -> str | None:
        if name in self.argv:
            return self.argv[self.argv.index(name) + 1]
        return None


def doc_pages() -> list[Path]:
    pages = [*sorted(DOCS.rglob("*.md")), REPO / "README.md"]
    pages += sorted(REPO.glob("plugins/*/README.md"))
    return pages


def console_commands(page: Path) -> list[DocCommand]:
    """Each ``$ areno train`` command of the page's console blocks, with the lines it printed."""
    found = []
    name = str(page.relative_to(REPO))
    for block in re.findall(r"^```console\n(.*?)^```", page.read_text(), re.S | re.M):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ areno train"):
                i += 1
                continue
            command = lines[i][2:]
            while command.endswith("\\"):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            output = []
            i += 1
            while i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i])
                i += 1
            if "..." not in command:
                found.append(DocCommand(name, tuple(shlex.split(command)[1:]), tuple(output)))
    return found


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


# -- what a page's commands need ----------------------------------------------------------


def _getting_started(page: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files the page asks the reader to save: sft.yaml and digits_reward.py."""
    text = page.read_text()
    [yaml_block] = [b for b in _code_blocks(text, "yaml") if b.startswith("# sft.yaml")]
    (folder / "sft.yaml").write_text(yaml_block)
    [reward] = [b for b in _code_blocks(text, "python") if "def reward_fn(record)" in b]
    (folder / "digits_reward.py").write_text(reward)


def _example_pack(page: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pip install -e examples/plugin-pack``, as an entry point on sys.path."""
    pack = REPO / "examples" / "plugin-pack"
    info = folder / "site" / "areno_mypack-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: areno-mypack\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[areno]\nmypack = areno_mypack\n")
    monkeypatch.syspath_prepend(str(pack))
    monkeypatch.syspath_prepend(str(folder / "site"))


Setup = Callable[[Path, Path, pytest.MonkeyPatch], None]
PAGE_SETUP: dict[str, Setup] = {
    "docs/getting-started.md": _getting_started,
    "docs/plugin-authors.md": _example_pack,
}
PAGES = [p for p in doc_pages() if console_commands(p)]


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    set_registry(None)
    yield
    set_registry(None)
    for module in [m for m in sys.modules if m.split(".")[0] == "areno_mypack"]:
        sys.modules.pop(module, None)


def _working_folder(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder with the repository's data/ and examples/ in it, plus the page's own
    files; it becomes the current directory."""
    folder = tmp_path / "work"
    folder.mkdir()
    for shared in ("data", "examples"):
        (folder / shared).symlink_to(REPO / shared, target_is_directory=True)
    setup = PAGE_SETUP.get(str(page.relative_to(REPO)))
    if setup is not None:
        setup(page, folder, monkeypatch)
    monkeypatch.chdir(folder)
    return folder


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = 0
    try:
        main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def _needs_more_than_a_cpu_test(command: DocCommand) -> bool:
    """A hub model or dataset (``org/name``, ``name:config``), or several devices."""
    for name in ("--ckpt", "--dataset-path"):
        value = command.option(name)
        if value and not value.startswith("random:") and not Path(value).exists():
            return True
    return int(command.option("--world-size") or 1) > 1


def _two_steps(argv: tuple[str, ...], run: Path) -> list[str]:
    out = list(argv)
    for name in ("--max-steps", "--save-path"):
        while name in out:
            i = out.index(name)
            del out[i : i + 2]
    return [*out, "--max-steps", "2", "--save-path", str(run)]


def test_doc_pages_with_commands_are_found():
    names = {str(p.relative_to(REPO)) for p in PAGES}
    assert {"docs/getting-started.md", "docs/plugin-authors.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_doc_commands_run_and_quote_their_real_errors(
    page, tmp_path, monkeypatch, capsys, fresh_registry
):
    folder = _working_folder(page, tmp_path, monkeypatch)
    for n, command in enumerate(console_commands(page)):
        where = f"{command.page}: areno {shlex.join(command.argv)}"
        if command.error is not None:
            code, err = _run(list(command.argv), capsys)
            assert code != 0, where
            got = [line for line in err.splitlines() if line.startswith("Error: ")]
            assert got, f"{where}: no error printed:\n{err}"
            assert " ".join(got[0].split()) == " ".join(command.error.split()), where
        elif {"--list-recipes", "--help"} & set(command.argv):  # trains nothing
            code, err = _run(list(command.argv), capsys)
            assert code == 0, f"{where}:\n{err}"
        elif "--dry-run" in command.argv or _needs_more_than_a_cpu_test(command):
            code, err = _run([*command.argv, "--dry-run"], capsys)
            assert code == 0, f"{where}:\n{err}"
        else:
            run = folder / f"doc-run-{n}"
            code, err = _run(_two_steps(command.argv, run), capsys)
            assert code == 0, f"{where}:\n{err}"
            steps = [
                json.loads(line)
                for line in (run / "tensorboard" / "metrics.jsonl").read_text().splitlines()
            ]
            assert [s["step"] for s in steps if "train/loss" in s] == [1, 2], where


# -- Python API snippets --------------------------------------------------------------------


@pytest.mark.parametrize("page", ["README.md", "docs/python-api.md"])
def test_python_api_first_snippet_runs_as_written(page, tmp_path, monkeypatch):
    text = (REPO / page).read_text()
    [snippet] = [b for b in _code_blocks(text, "python") if "backend.train(model, rows" in b][:1]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(snippet, f"{page} (Python API snippet)", "exec"), namespace)
    result = namespace["result"]
    assert result.step == 1  # type: ignore[attr-defined]
    assert math.isfinite(result.metrics["train/loss"])  # type: ignore[attr-defined]

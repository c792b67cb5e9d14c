"""Meta-tests that keep the documentation honest.

- every hook in ``areno_core/hookspecs.py`` has a ``### name`` section in docs/plugins.md with
  its signature, and no section documents a hook that does not exist;
- every hook is mentioned by at least one test (other than this file);
- docs/cli.md is what ``python -m areno_core.docs_gen`` generates, and names every option;
- every relative link in the docs and READMEs points to an existing file (and heading);
- docs/index.md links every page of docs/;
- the listings in docs/plugin-authors.md are the example pack's real files;
- the ``areno train`` commands of every page run (cheap ones for 2 steps, the others resolve
  with ``--dry-run``), the errors they quote are the real ones, and the Python API snippets of
  the README and docs/python-api.md run as written (tests/test_docs_commands.py).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from areno_core import hookspecs
from areno_core.config import iter_options
from areno_core.docs_gen import DOC_PATH, render_cli_reference

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
HOOKS = sorted(
    name
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if getattr(fn, "areno_spec", None) is not None
)
LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE_RE = re.compile(r"^```.*?^```", re.S | re.M)


def _sections(text: str, level: int = 3) -> dict[str, str]:
    """Heading text -> its section's body, up to the next heading of the same or a higher level.

    Lines inside fenced code blocks are never headings.
    """
    out: dict[str, str] = {}
    current: str | None = None
    in_fence = False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            in_fence = not in_fence
        heading = None if in_fence else re.match(r"^(#{1,6}) (.+)$", line)
        if heading and len(heading.group(1)) <= level:
            current = (
                heading.group(2).strip().strip("`") if len(heading.group(1)) == level else None
            )
            if current is not None:
                out[current] = ""
            continue
        if current is not None:
            out[current] += line
    return out


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE_RE.sub("", path.read_text())
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _doc_files() -> list[Path]:
    files = [*sorted(DOCS.rglob("*.md")), REPO / "README.md"]
    files += sorted(REPO.glob("examples/*/README.md"))
    files += sorted(REPO.glob("plugins/*/README.md"))
    return [f for f in files if f.is_file()]


# -- hooks ----------------------------------------------------------------------------------


def test_hookspecs_found_by_meta_tests():
    assert "register_algorithms" in HOOKS
    assert len(HOOKS) >= 6


@pytest.mark.parametrize("hook", HOOKS)
def test_plugins_doc_hook_section_shows_signature(hook):
    sections = _sections((DOCS / "plugins.md").read_text())
    assert hook in sections, f"docs/plugins.md has no '### {hook}' section"
    blocks = _code_blocks(sections[hook])
    assert any(f"def {hook}(register)" in b for b in blocks), (
        f"the '### {hook}' section of docs/plugins.md has no code block with 'def {hook}(register)'"
    )
    assert any("@hookimpl" in b for b in blocks), f"'### {hook}' has no example plugin"


def test_plugins_doc_hook_sections_only_real_hooks():
    sections = _sections((DOCS / "plugins.md").read_text())
    documented = {name for name in sections if name.startswith("register_")}
    assert documented == set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_mentioned_by_a_test(hook):
    this = Path(__file__).resolve()
    test_files = [
        *REPO.glob("tests/**/test_*.py"),
        *REPO.glob("plugins/*/tests/**/test_*.py"),
        *REPO.glob("examples/*/tests/**/test_*.py"),
    ]
    mentioned = [p for p in test_files if p.resolve() != this and hook in p.read_text()]
    assert mentioned, f"no test mentions {hook}; add one that registers something through it"


# -- generated CLI reference ----------------------------------------------------------------


def test_cli_reference_doc_matches_generated_text():
    assert DOC_PATH == DOCS / "cli.md"
    assert DOC_PATH.read_text() == render_cli_reference(), (
        "docs/cli.md is stale; regenerate it with: python -m areno_core.docs_gen"
    )


def test_generated_doc_blocks_are_current():
    from areno_core.docs_gen import generated_files

    pages = generated_files()
    assert DOCS / "algorithms.md" in pages and DOCS / "plugins.md" in pages
    stale = [str(p.relative_to(REPO)) for p, text in pages.items() if p.read_text() != text]
    assert stale == [], "stale generated docs; regenerate with: python -m areno_core.docs_gen"


@pytest.mark.parametrize(
    ("page", "protocol"),
    [
        ("plugins.md", "areno_core.contracts.engine.RolloutEngine"),
        ("rollout.md", "areno_core.contracts.engine.RolloutEngine"),
        ("plugins.md", "areno_core.contracts.backend.TrainingBackend"),
    ],
)
def test_plugin_docs_show_the_protocols_as_the_code_declares_them(page, protocol):
    import importlib

    from areno_core.docs_gen import protocol_outline

    module, _, name = protocol.rpartition(".")
    outline = protocol_outline(getattr(importlib.import_module(module), name))
    text = (DOCS / page).read_text()
    assert f"<!-- protocol: {protocol} -->\n```python\n{outline}\n```\n" in text
    for member in ("def sync_weights", "def generate") if "Rollout" in name else ("def train",):
        assert member in outline


def test_cli_reference_doc_names_every_config_option():
    text = (DOCS / "cli.md").read_text()
    missing = [
        field.name
        for _, field in iter_options()
        if f"`--{field.name.replace('_', '-')}" not in text
    ]
    assert missing == []


# -- links ----------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_doc_relative_links_point_to_existing_files(doc):
    text = FENCE_RE.sub("", doc.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    broken = []
    for target in LINK_RE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target} (no heading with anchor #{anchor})")
    assert broken == [], f"{doc.relative_to(REPO)}: broken links: {broken}"


def test_docs_index_links_every_page():
    text = (DOCS / "index.md").read_text()
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in LINK_RE.findall(text)}
    pages = {p.resolve() for p in DOCS.rglob("*.md")} - {(DOCS / "index.md").resolve()}
    missing = sorted(str(p.relative_to(DOCS)) for p in pages - linked)
    assert missing == [], "pages missing from docs/index.md"


# -- listings and commands ------------------------------------------------------------------


def test_plugin_authors_listings_match_pack_files():
    listings = [
        b
        for b in _code_blocks((DOCS / "plugin-authors.md").read_text())
        if b.startswith("# examples/plugin-pack/")
    ]
    assert len(listings) >= 3
    for block in listings:
        first, _, body = block.partition("\n")
        path = REPO / first[2:].strip()
        assert path.is_file(), f"docs/plugin-authors.md lists {path}, which does not exist"
        assert body == path.read_text(), f"the listing of {path.name} differs from the file"

"""The repository stands alone and its documentation references resolve.

A clone must not read or cite anything beside it (the fixtures and docs live inside it); every
`docs/…md` a file names exists; every section number cited from docs/upstream-behaviour.md
exists there; every relative link and repository path in README.md and docs/ points at
something real; every fixture has its entry in tests/fixtures/PROVENANCE.md. When code
moves or fixtures are added, these fail until the docs follow.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

DOCS = REPO / "docs"
BEHAVIOUR = DOCS / "upstream-behaviour.md"
# Generated or installed trees (see .gitignore): not part of the repository's content.
SKIP_DIRS = {".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}
SKIP_DIRS |= {"__pycache__", "dist"}
SKIP_PATHS = {REPO / "build" / "out", REPO / "bench" / "results"}
# Spelled in pieces so that this file does not match itself.
SIBLING = re.compile(re.escape("..") + "/shared|/work" + "/shared")
DOC_NAME = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)\b")
BEHAVIOUR_CITE = re.compile(
    r"upstream-behaviour\.md\)?,?((?:\s*(?:,|and|or|-|–)?\s*§[0-9A-Z]+(?:\.[0-9]+)?)+)"
)
SECTION = re.compile(r"§([0-9A-Z]+(?:\.[0-9]+)?)")
HEADING = re.compile(r"^#{2,3} ([0-9]+(?:\.[0-9]+)?|[A-Z])\.? ", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"`((?:multicall|tests|build|bench|packaging|docs|\.ci)/[^`\s]+)`")
NOT_A_PATH = re.compile(r"[{}*<>…]")
GENERATED = ("build/out/", "bench/results/")


def text_files() -> Iterator[tuple[Path, str]]:
    for base, dirs, files in os.walk(REPO):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and Path(base, d) not in SKIP_PATHS
        )
        for name in sorted(files):
            path = Path(base, name)
            data = path.read_bytes()
            if b"\0" not in data[:8192]:
                yield path, data.decode("utf-8", errors="replace")


FILES = list(text_files())
MARKDOWN = [p for p, _ in FILES if p.suffix == ".md" and p.parent in (DOCS, REPO)]


def behaviour_sections() -> set[str]:
    return set(HEADING.findall(BEHAVIOUR.read_text()))


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_nothing_refers_to_a_sibling_folder() -> None:
    """Fixtures and docs are inside the repository; a clone needs nothing beside it."""
    offenders = [str(p.relative_to(REPO)) for p, text in FILES if SIBLING.search(text)]
    assert offenders == []


def test_cited_docs_exist() -> None:
    missing = {
        f"{p.relative_to(REPO)}: docs/{name}"
        for p, text in FILES
        for name in DOC_NAME.findall(text)
        if not (DOCS / name).is_file()
    }
    assert sorted(missing) == []


def test_cited_behaviour_sections_exist() -> None:
    """Section numbers cited after the behaviour doc's name anywhere, and every section sign
    inside docs/, name a section of docs/upstream-behaviour.md."""
    sections = behaviour_sections()
    assert {"1.1", "3", "4.1", "11", "A"} <= sections
    cited: set[tuple[str, str]] = set()
    for path, text in FILES:
        where = str(path.relative_to(REPO))
        for run in BEHAVIOUR_CITE.findall(text):
            cited |= {(where, s) for s in SECTION.findall(run)}
        if path.parent == DOCS:  # within docs/, § always means upstream-behaviour.md
            cited |= {(where, s) for s in SECTION.findall(text)}
    assert sorted((w, s) for w, s in cited if s not in sections) == []


def resolves(source: Path, target: str) -> bool:
    """A relative link from `source`: the file exists and, for Markdown, so does the anchor."""
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.exists():
        return False
    return not anchor or resolved.suffix != ".md" or anchor in anchors(resolved.read_text())


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_markdown_links_resolve(path: Path) -> None:
    links = [t for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", t)]
    assert [t for t in links if not resolves(path, t)] == []


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_repository_paths_in_docs_exist(path: Path) -> None:
    """A backticked `multicall/…`, `tests/…`, `build/…` path in the docs names a real file."""
    missing = [
        token
        for token in REPO_PATH.findall(path.read_text())
        if not NOT_A_PATH.search(token)
        and not (token.rstrip("/") + "/").startswith(GENERATED)
        and not (REPO / token.rstrip("/")).exists()
    ]
    assert missing == []


def test_every_fixture_has_its_provenance() -> None:
    """Each upstream file is a row of PROVENANCE.md; each derived folder has its section."""
    fixtures = REPO / "tests" / "fixtures"
    provenance = (fixtures / "PROVENANCE.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+)` \| [A-Z0-9-]+ \| `", provenance, re.MULTILINE))
    upstream = {
        str(p.relative_to(fixtures / "upstream"))
        for p in (fixtures / "upstream").rglob("*")
        if p.is_file()
    }
    assert upstream == rows
    derived = {p.name for p in (fixtures / "derived").iterdir() if p.is_dir()}
    sections = set(re.findall(r"^### derived/([^/]+)/", provenance, re.MULTILINE))
    assert derived == sections


def test_architecture_names_every_module() -> None:
    """docs/architecture.md's package layout names every module of multicall/: by its path,
    or by its folder (the last part of it, as the nested lines write it) and its file name;
    a package by its folder."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    block = doc.split("## Package layout", 1)[1].split("```", 2)[1]
    missing = []
    for path in sorted((REPO / "multicall").rglob("*.py")):
        rel = path.relative_to(REPO / "multicall")
        folders = rel.parts[:-1]
        named_folder = any("/".join(folders[i:]) + "/" in block for i in range(len(folders)))
        if rel.name == "__init__.py":
            if folders and not named_folder:
                missing.append(str(rel))
        elif str(rel) not in block and not (
            (named_folder or not folders)
            and re.search(r"(?<![\w/])" + re.escape(rel.name) + r"\b", block)
        ):
            missing.append(str(rel))
    assert missing == [], "name these in docs/architecture.md's package layout"

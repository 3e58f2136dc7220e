"""Fixtures of the artifact suites: the file under test, its content hash, an empty cache."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.artifact import artifact_path, read_trailer


@pytest.fixture(scope="session")
def artifact() -> Path:
    path = artifact_path()
    read_trailer(path)
    return path


@pytest.fixture
def content_hash(artifact: Path) -> str:
    return read_trailer(artifact)[3]


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    """An empty extraction root for one test (CNIBOX_CACHE)."""
    path = tmp_path / "cache"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)

"""Where things are: the repository, and the fixtures inside it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Upstream files and outputs derived from upstream tools; tests/fixtures/PROVENANCE.md says
# where each one comes from.
FIXTURES = REPO / "tests" / "fixtures"

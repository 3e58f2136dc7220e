"""The chart's helpers (packaging/helm/manifests.py) and the pinned helm, for the chart and
release tests: one place that knows where `make deps` puts helm and how it is isolated."""

from __future__ import annotations

import os
import sys

from tests.support.paths import REPO
from tests.support.policy import skip_or_fail

sys.path.insert(0, str(REPO / "packaging" / "helm"))
import manifests  # packaging/helm/manifests.py, found through the path above


def pinned_helm() -> str:
    """The pinned helm (packaging/helm/tools.py, `make deps`); without it the test is skipped,
    which fails under CI=true."""
    path = manifests.default_helm()
    if not os.access(path, os.X_OK):
        skip_or_fail(f"needs the pinned helm at {path} (make deps)")
    return path


__all__ = ["manifests", "pinned_helm"]

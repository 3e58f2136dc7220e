"""Render the plain manifests from the chart: `manifests.py [--check] [--helm PATH] [OUT_DIR]`.

The chart (packaging/helm/linkerd2-cni) is the one source of the Kubernetes objects. For
operators who apply YAML instead of running Helm, two renderings of it are committed under
packaging/kubernetes/ (and shipped in the release):

- `linkerd-cni.yaml`: the chart's defaults plus the Namespace (`installNamespace=true`), for
  any node: install-cni copies cnibox into the CNI bin dir;
- `linkerd-cni-talos.yaml`: the same with `talos.extension=true`, for Talos nodes that run
  the cnibox system extension (install-cni links to the extension's copy).

`--check` compares instead of writing and exits 1 when a committed file differs from what
`helm template` renders now (a test runs it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHART = HERE / "linkerd2-cni"
OUT_DIR = HERE.parent / "kubernetes"
RELEASE = "linkerd2-cni"
NAMESPACE = "linkerd-cni"
# File -> the `--set` arguments it is rendered with.
MANIFESTS: Mapping[str, Sequence[str]] = {
    "linkerd-cni.yaml": ("installNamespace=true",),
    "linkerd-cni-talos.yaml": ("installNamespace=true", "talos.extension=true"),
}
HEADER = (
    "# Rendered from packaging/helm/linkerd2-cni by packaging/helm/manifests.py:\n"
    "#   helm template {release} packaging/helm/linkerd2-cni --namespace {namespace}{sets}\n"
    "# Do not edit; change the chart (or pass your own values to it) instead.\n"
)


class RenderError(Exception):
    """helm failed; the message is helm's own."""


def default_helm() -> str:
    """The pinned helm `make` installs into the venv (packaging/helm/tools.py)."""
    return os.environ.get("CNIBOX_HELM", str(Path(sys.prefix) / "tools" / "bin" / "helm"))


def helm_environment(home: str) -> dict[str, str]:
    """helm's state (cache, config, plugins) kept in a throwaway dir: nothing from ~ leaks in."""
    env = dict(os.environ)
    for name in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{name}_HOME"] = os.path.join(home, name.lower())
    return env


def helm_template(
    helm: str,
    sets: Sequence[str] = (),
    values_files: Sequence[Path] = (),
    namespace: str = NAMESPACE,
    chart: Path = CHART,
) -> str:
    """`helm template` of the chart; raises RenderError with helm's message on failure."""
    argv = [helm, "template", RELEASE, str(chart), "--namespace", namespace]
    for path in values_files:
        argv += ["--values", str(path)]
    for assignment in sets:
        argv += ["--set", assignment]
    with tempfile.TemporaryDirectory(prefix="cnibox-helm-") as home:
        proc = subprocess.run(
            argv, capture_output=True, text=True, check=False, env=helm_environment(home)
        )
    if proc.returncode != 0:
        raise RenderError(proc.stderr.strip() or f"helm exited {proc.returncode}")
    return proc.stdout


def render(helm: str, name: str) -> str:
    sets = MANIFESTS[name]
    header = HEADER.format(
        release=RELEASE, namespace=NAMESPACE, sets="".join(f" --set {s}" for s in sets)
    )
    return header + helm_template(helm, sets)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--helm", default=default_helm(), help="helm binary (default: %(default)s)")
    parser.add_argument("out_dir", nargs="?", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    stale = []
    try:
        for name in MANIFESTS:
            text = render(args.helm, name)
            path = args.out_dir / name
            if not args.check:
                path.write_text(text)
            elif not path.is_file() or path.read_text() != text:
                stale.append(path)
    except (RenderError, OSError) as exc:
        sys.stderr.write(f"manifests.py: {exc}\n")
        return 1
    for path in stale:
        sys.stderr.write(f"{path} differs from the chart's rendering: run {sys.argv[0]}\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

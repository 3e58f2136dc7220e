"""The applet registry, built from static imports so Nuitka follows every applet.

Adding an applet: one module here with a usage docstring, `SPEC` and `main`, one import and
one entry in `REGISTRY` below, one line in the README's applet table (a test checks all four).
"""

from __future__ import annotations

from multicall.applet import AppletSpec
from multicall.applets import install_cni, iptables_verify, linkerd_cni, netns_exec

REGISTRY: tuple[AppletSpec, ...] = (
    netns_exec.SPEC,
    install_cni.SPEC,
    linkerd_cni.SPEC,
    iptables_verify.SPEC,
)


def find_applet(name: str) -> AppletSpec | None:
    """The applet answering to `name` (its own name or an alias), if any."""
    for spec in REGISTRY:
        if name in spec.names:
            return spec
    return None


def all_names() -> list[str]:
    """Every name an applet answers to, sorted (what `--list` prints)."""
    return sorted(name for spec in REGISTRY for name in spec.names)

"""The applet registry: every applet's names, and a loader whose static import Nuitka follows.

An applet module is imported only when it runs (or when the whole registry is listed):
importing all of them cost every `linkerd-cni` start ~24 dataclasses and their modules
(about a tenth of an ADD's CPU time, bench/README "Benchmark").

Adding an applet: one module here with a usage docstring, `SPEC` and `main`, one loader and
one entry in `LOADERS` below (with the SPEC's names), one line in the README's applet table
(tests check all of them agree).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

from multicall.applet import AppletSpec


def _netns_exec() -> AppletSpec:
    from multicall.applets import netns_exec

    return netns_exec.SPEC


def _install_cni() -> AppletSpec:
    from multicall.applets import install_cni

    return install_cni.SPEC


def _linkerd_cni() -> AppletSpec:
    from multicall.applets import linkerd_cni

    return linkerd_cni.SPEC


def _iptables_verify() -> AppletSpec:
    from multicall.applets import iptables_verify

    return iptables_verify.SPEC


def _repair_controller() -> AppletSpec:
    from multicall.applets import linkerd_cni_repair_controller

    return linkerd_cni_repair_controller.SPEC


# Each applet's names (SPEC.names, checked by tests/unit/test_registry.py) and its loader.
LOADERS: tuple[tuple[tuple[str, ...], Callable[[], AppletSpec]], ...] = (
    (("netns-exec", "nsenter"), _netns_exec),
    (("install-cni",), _install_cni),
    (("linkerd-cni",), _linkerd_cni),
    (("iptables-verify",), _iptables_verify),
    (("linkerd-cni-repair-controller",), _repair_controller),
)


class _Registry(Sequence[AppletSpec]):
    """Every applet's spec, in LOADERS order; iterating it imports every applet module."""

    @overload
    def __getitem__(self, index: int) -> AppletSpec: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[AppletSpec]: ...
    def __getitem__(self, index: int | slice) -> AppletSpec | Sequence[AppletSpec]:
        specs = tuple(load() for _, load in LOADERS)
        return specs[index]

    def __len__(self) -> int:
        return len(LOADERS)

    def __iter__(self) -> Iterator[AppletSpec]:
        return (load() for _, load in LOADERS)


REGISTRY: Sequence[AppletSpec] = _Registry()


def find_applet(name: str) -> AppletSpec | None:
    """The applet answering to `name` (its own name or an alias), if any."""
    for names, load in LOADERS:
        if name in names:
            return load()
    return None


def all_names() -> list[str]:
    """Every name an applet answers to, sorted (what `--list` prints)."""
    return sorted(name for names, _ in LOADERS for name in names)

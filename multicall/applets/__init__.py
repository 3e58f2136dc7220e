"""The applet table: every applet's name, aliases, summary and module, in one place.

Only the applet that runs is imported: a row's loader holds a static import (which Nuitka
follows) and is called when its applet runs; `cnibox --help` and `--list` read the table
alone. Importing every applet cost each `linkerd-cni` start ~24 dataclasses and their
modules, about a tenth of an ADD's CPU time (docs/benchmarks.md).

Adding an applet: a module here whose docstring is its usage text and which defines `main`
(multicall/applet.py), one loader and one row below, one line in the README's applet table
(tests check all three agree). Its command line follows docs/cli.md, which
tests/pure/test_cli_convention.py and tests/netns/test_cli_bare.py check for every row.
"""

from __future__ import annotations

from multicall.applet import Applet, AppletModule


def _netns_exec() -> AppletModule:
    from multicall.applets import netns_exec

    return netns_exec


def _install_cni() -> AppletModule:
    from multicall.applets import install_cni

    return install_cni


def _linkerd_cni() -> AppletModule:
    from multicall.applets import linkerd_cni

    return linkerd_cni


def _iptables_verify() -> AppletModule:
    from multicall.applets import iptables_verify

    return iptables_verify


def _linkerd_cni_agent() -> AppletModule:
    from multicall.applets import linkerd_cni_agent

    return linkerd_cni_agent


def _linkerd_cni_repair_controller() -> AppletModule:
    from multicall.applets import linkerd_cni_repair_controller

    return linkerd_cni_repair_controller


# In `cnibox --help` order. Each comment says why the applet needs root where it does.
APPLETS: tuple[Applet, ...] = (
    # setns(2) needs CAP_SYS_ADMIN in the target namespace's user namespace
    Applet(
        "netns-exec",
        ("nsenter",),
        "run a program in other namespaces (nsenter drop-in)",
        _netns_exec,
        parses_help=True,
        version_note="util-linux 2.38.1 compatible",
    ),
    # writes the host's CNI bin and config dirs through hostPath mounts
    Applet(
        "install-cni",
        (),
        "install and keep Linkerd's CNI plugin chained on this node (DaemonSet)",
        _install_cni,
    ),
    # programs iptables rules inside pod network namespaces
    Applet(
        "linkerd-cni",
        (),
        "Linkerd's chained CNI plugin (upstream-compatible, no host binaries)",
        _linkerd_cni,
    ),
    # --netns/--pid enter another network namespace (CAP_SYS_ADMIN, CAP_NET_ADMIN)
    Applet(
        "iptables-verify",
        (),
        "compare a pod's nat table with what linkerd-cni would program",
        _iptables_verify,
    ),
    # CAP_NET_ADMIN for nf_tables; CAP_SYS_ADMIN to enter pod netns for legacy (docs/agent.md)
    Applet(
        "linkerd-cni-agent",
        ("agent",),
        "resident node agent serving linkerd-cni without a Python start per pod",
        _linkerd_cni_agent,
    ),
    # none by default (upstream's: API access only); --repair-in-place enters pod network
    # namespaces (CAP_SYS_ADMIN) and programs nat there (CAP_NET_ADMIN, CAP_NET_RAW)
    Applet(
        "linkerd-cni-repair-controller",
        (),
        "delete (or repair) pods whose Linkerd network validator failed",
        _linkerd_cni_repair_controller,
        parses_help=True,  # clap's rules: -V too, and a flag's value is not a request
    ),
)


def _selftest() -> AppletModule:
    from multicall.applets import selftest

    return selftest


# Hidden rows: found by name like the others, but not in `--help`, `--list` or `--install`
# (nor the README): probes of the built binary that its tests run (tests/binary, tests/arm64).
HIDDEN: tuple[Applet, ...] = (
    Applet("selftest", (), "probes of the built binary for its tests", _selftest),
)


def find_applet(name: str) -> Applet | None:
    """The applet answering to `name` (its own name or an alias), if any, hidden ones too."""
    return next((applet for applet in (*APPLETS, *HIDDEN) if name in applet.names), None)


def all_names() -> list[str]:
    """Every name an applet answers to, sorted (what `--list` prints)."""
    return sorted(name for applet in APPLETS for name in applet.names)

"""Debian's iptables save tools as oracles, run inside a rig's network namespace (never the
machine's own): what the kernel holds, printed by the real tools."""

from __future__ import annotations

from multicall.core.firewall.model import Family, Mode
from tests.support.policy import require_tool
from tests.support.rig import Netns
from tests.support.scenarios import comparable_save, save_body

# The two kernel interfaces the engine programs (`plain` picks one of them).
MODES = [Mode.LEGACY, Mode.NFT]
# The save tool upstream's own run uses per `iptables-mode`.
SAVE = {"legacy": "iptables-legacy-save", "nft": "iptables-nft-save", "plain": "iptables-save"}


def save_tool(mode: Mode, family: Family) -> str:
    prefix = "iptables" if family is Family.IPV4 else "ip6tables"
    flavour = "legacy" if mode is Mode.LEGACY else "nft"
    return require_tool(f"{prefix}-{flavour}-save")


def oracle(ns: Netns, mode: Mode, family: Family) -> list[str]:
    """The `*nat` body the real save tool prints inside `ns`."""
    return save_body(ns.exec([save_tool(mode, family), "-t", "nat"]))


def save_text(netns: Netns, tool: str) -> str:
    """`TOOL -t nat` inside the netns, without its timestamped comments."""
    return comparable_save(netns.exec([tool, "-t", "nat"]))


def proxy_init_lines(netns: Netns) -> list[str]:
    """Every PROXY_INIT line either backend holds in the netns (none: the pod got no rules)."""
    out = []
    for tool in ("iptables-nft-save", "iptables-legacy-save"):
        out += [
            line for line in netns.exec([tool, "-t", "nat"]).splitlines() if "PROXY_INIT" in line
        ]
    return out

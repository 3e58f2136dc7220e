"""nft codec test data: the rules of the fixture save texts, and hypothesis strategies that
draw every `RuleSpec` shape the codec encodes."""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path

from hypothesis import strategies as st

from multicall.core.firewall.model import Family, TableChange
from multicall.core.firewall.nft import dump as nft_dump
from multicall.core.firewall.nft import expr as nft_expr
from multicall.core.firewall.nft import netlink as nft_netlink
from multicall.core.firewall.nft import rulespec as nft_spec
from multicall.core.firewall.nft import xt
from multicall.core.firewall.ports import PortRange
from multicall.core.firewall.ruleset import Rule
from multicall.effects.firewall import nft as nft_backend

V4, V6 = Family.IPV4, Family.IPV6


def save_rules(path: Path) -> list[Rule]:
    """`-A` lines of a save text as canonical rules (iptables quoting is shlex-compatible)."""
    rules = []
    for line in path.read_text().splitlines():
        if line.startswith("-A "):
            tokens = shlex.split(line)
            rules.append(Rule(tokens[1], tuple(tokens[2:])))
    return rules


def family_of(path: Path) -> Family:
    return V6 if "ipv6" in path.name else V4


def typed(exprs: tuple[nft_expr.Expr, ...]) -> list[tuple[str, nft_expr.Expr]]:
    """Expressions with their class names: NamedTuples of equal fields compare equal."""
    return [(type(e).__name__, e) for e in exprs]


_ports = st.integers(1, 65535)
_ranges = st.tuples(_ports, _ports).map(lambda p: PortRange(min(p), max(p)))
_text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=40)


def _address(draw: st.DrawFn, family: Family) -> nft_spec.Address | None:
    bits = 32 if family is V4 else 128
    prefix = draw(st.none() | st.integers(1, bits))
    if prefix is None:
        return None
    value = draw(st.integers(0, 2**bits - 1))
    addr = ipaddress.IPv4Address(value) if family is V4 else ipaddress.IPv6Address(value)
    return nft_spec.Address(nft_spec.parse_network(f"{addr}/{prefix}", family), draw(st.booleans()))


def _ids(draw: st.DrawFn) -> tuple[xt.IdRange | None, bool]:
    low = draw(st.integers(0, 70000))
    high = draw(st.sampled_from([low, low + 5]))
    return draw(st.none() | st.just((low, high))), draw(st.booleans())


def _matches(draw: st.DrawFn, proto: int | None) -> tuple[nft_spec.MatchSpec, ...]:
    out: list[nft_spec.MatchSpec] = []
    if proto is not None and draw(st.booleans()):
        name = "tcp" if proto == 6 else "udp"
        sport, dport = draw(st.none() | _ranges), draw(_ranges)
        sinv = sport is not None and draw(st.booleans())
        out.append(nft_spec.PortMatch(name, sport, sinv, dport, draw(st.booleans())))
    if proto is not None and draw(st.booleans()):
        ports = draw(st.lists(_ranges, min_size=1, max_size=7))
        option = draw(st.sampled_from(sorted(xt.MULTIPORT_FLAGS)))
        out.append(xt.Multiport(option, tuple(ports), draw(st.booleans())))
    if draw(st.booleans()):
        (uid, uinv), (gid, ginv) = _ids(draw), _ids(draw)
        socket_exists = draw(st.booleans()) or (uid is None and gid is None)
        out.append(
            xt.Owner(
                uid,
                uinv and uid is not None,
                gid,
                ginv and gid is not None,
                socket_exists,
                socket_exists and draw(st.booleans()),
            )
        )
    if draw(st.booleans()):
        out.append(xt.Comment(draw(_text)))
    return tuple(out)


def _target(draw: st.DrawFn) -> nft_spec.TargetSpec | None:
    ports = draw(st.none() | _ranges)
    targets: list[nft_spec.TargetSpec | None] = [
        None,
        nft_spec.Verdict("RETURN"),
        nft_spec.Verdict("ACCEPT"),
        nft_spec.Verdict("X"),
        nft_spec.Verdict("X", goto=True),
        xt.Redirect(ports, draw(st.booleans())),
    ]
    return draw(st.sampled_from(targets))


_ifaces = st.sampled_from(["lo", "eth0", "eth+", "veth1234567890a"])


@st.composite
def rule_specs(draw: st.DrawFn) -> tuple[Family, nft_spec.RuleSpec]:
    family = draw(st.sampled_from([V4, V6]))
    proto = draw(st.sampled_from([None, 6, 17]))
    in_iface = draw(st.none() | st.builds(nft_spec.Iface, _ifaces, st.booleans()))
    spec = nft_spec.RuleSpec(
        source=_address(draw, family),
        destination=_address(draw, family),
        in_iface=in_iface,
        out_iface=draw(st.none() | st.builds(nft_spec.Iface, _ifaces, st.booleans())),
        proto=nft_spec.Proto(proto) if proto else None,
        matches=_matches(draw, proto),
        target=_target(draw),
    )
    return family, spec


def big_change(rules: int, last: Rule | None = None) -> TableChange:
    """A new nat chain BIG with `rules` RETURN rules (one port each), and `last` after them:
    a batch as large as a test needs."""
    body = tuple(
        Rule("BIG", ("-p", "tcp", "-m", "tcp", "--dport", str(1000 + i), "-j", "RETURN"))
        for i in range(rules)
    )
    return TableChange("nat", ("BIG",), (), body + ((last,) if last else ()))


def read_chains(family: Family) -> list[nft_dump.ChainInfo]:
    """The chains of every table of one family, as the kernel reports them."""
    return nft_backend._read_consistent(
        lambda sock: [
            nft_dump.parse_chain(m)
            for m in nft_backend._dump(sock, nft_netlink.NFT_MSG_GETCHAIN, family, None)
        ],
        "the ruleset",
    )

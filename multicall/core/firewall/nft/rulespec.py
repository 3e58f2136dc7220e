"""One rule as iptables sees it: the canonical `iptables-save` tokens of the rules the nft
codec can encode, parsed into a `RuleSpec` and rendered back.

This is a parser of the *canonical output* language only (what iptables-nft-save prints, in
its fixed order), not of everything iptables accepts: `canonical_spec` refuses any spelling
that would print differently (docs/architecture.md, "The one rule format and its parsers").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

from multicall.core.firewall.model import COMMENT_LEN, Family
from multicall.core.firewall.nft.expr import VERDICT_CODES
from multicall.core.firewall.nft.xt import (
    MULTIPORT_FLAGS,
    MULTIPORT_MAX,
    Comment,
    IdRange,
    Multiport,
    Notrack,
    Owner,
    Redirect,
)
from multicall.core.firewall.ports import PortRange, Syntax, parse_port_range
from multicall.core.firewall.protocols import NUMBERS, SAVE_NAMES
from multicall.core.firewall.ruleset import format_network
from multicall.errors import FirewallError

IFNAMSIZ = 16
# Protocols the codec encodes (`-p` is a native l4proto compare), printed by their save name.
NFT_PROTOCOLS = frozenset({1, 6, 17, 58, 132})
PROTO_NAMES = {number: SAVE_NAMES[number] for number in NFT_PROTOCOLS}

# --- RuleSpec: one rule as iptables sees it ----------------------------------------------------


class Address(NamedTuple):
    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    invert: bool = False


class Iface(NamedTuple):
    name: str  # "eth+" is the wildcard form
    invert: bool = False


class Proto(NamedTuple):
    number: int
    invert: bool = False


class PortMatch(NamedTuple):
    """`-m tcp` / `-m udp` with --sport/--dport (encoded natively by iptables-nft)."""

    proto: str
    sport: PortRange | None = None
    sport_invert: bool = False
    dport: PortRange | None = None
    dport_invert: bool = False


MatchSpec = PortMatch | Multiport | Owner | Comment


class Verdict(NamedTuple):
    """-j ACCEPT/DROP/RETURN, -j CHAIN (jump), -g CHAIN (goto)."""

    name: str
    goto: bool = False


TargetSpec = Verdict | Redirect | Notrack  # Notrack: decoded only (xt.py)


class RuleSpec(NamedTuple):
    source: Address | None = None
    destination: Address | None = None
    in_iface: Iface | None = None
    out_iface: Iface | None = None
    proto: Proto | None = None
    matches: tuple[MatchSpec, ...] = ()
    target: TargetSpec | None = None


# --- tokens -> RuleSpec ----------------------------------------------------------------------


class _Tokens:
    __slots__ = ("items", "pos")

    def __init__(self, items: Sequence[str]) -> None:
        self.items = items
        self.pos = 0

    def peek(self) -> str | None:
        return self.items[self.pos] if self.pos < len(self.items) else None

    def take(self, what: str) -> str:
        if self.pos >= len(self.items):
            raise FirewallError(f"option {what} requires a value")
        self.pos += 1
        return self.items[self.pos - 1]

    def take_invert(self) -> bool:
        inv = False
        while self.peek() == "!":
            self.pos += 1
            inv = not inv
        return inv


def parse_spec(tokens: Sequence[str], family: Family) -> RuleSpec:
    """Parse a rule's tokens (after `-A CHAIN`); raises FirewallError on anything unsupported."""
    fields: dict[str, object] = {}
    matches: list[MatchSpec] = []
    target: TargetSpec | None = None
    toks = _Tokens(tokens)
    while (tok := toks.peek()) is not None:
        invert = toks.take_invert()
        tok = toks.take("rule")
        if tok in ("-s", "-d", "-i", "-o", "-p"):
            fields[tok] = _parse_basic(tok, toks.take(tok), invert, family)
        elif tok == "-m" and not invert:
            matches.append(_parse_match(toks.take("-m"), toks, fields.get("-p")))
        elif tok in ("-j", "-g") and not invert and target is None:
            target = _parse_target(tok, toks.take(tok), toks)
        else:
            raise FirewallError(f"unsupported rule option {'! ' if invert else ''}{tok}")
    return assemble(fields, tuple(matches), target)


def assemble(
    fields: Mapping[str, object], matches: tuple[MatchSpec, ...], target: TargetSpec | None
) -> RuleSpec:
    src, dst = fields.get("-s"), fields.get("-d")
    iin, iout, proto = fields.get("-i"), fields.get("-o"), fields.get("-p")
    return RuleSpec(
        source=src if isinstance(src, Address) else None,
        destination=dst if isinstance(dst, Address) else None,
        in_iface=iin if isinstance(iin, Iface) else None,
        out_iface=iout if isinstance(iout, Iface) else None,
        proto=proto if isinstance(proto, Proto) and proto.number else None,
        matches=matches,
        target=target,
    )


def _parse_basic(opt: str, value: str, invert: bool, family: Family) -> Address | Iface | Proto:
    if opt in ("-s", "-d"):
        return Address(parse_network(value, family), invert)
    if opt in ("-i", "-o"):
        if not value or value == "+" or len(value) >= IFNAMSIZ:
            raise FirewallError(f"invalid interface name `{value}'")
        return Iface(value, invert)
    return Proto(parse_proto(value), invert)


def parse_network(value: str, family: Family) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A CIDR (or bare host address) of the family, host bits cleared as iptables does."""
    cls = ipaddress.IPv4Network if family is Family.IPV4 else ipaddress.IPv6Network
    try:
        return cls(value, strict=False)
    except ValueError as exc:
        host = value.split("/", 1)[0]
        raise FirewallError(f"host/network `{host}' not found") from exc


def parse_proto(value: str) -> int:
    """`-p`: `all`/`0`, a number 1..255, or the name of a protocol the codec encodes."""
    if value in ("all", "0"):
        return 0
    if value.isascii() and value.isdigit() and 0 < int(value) < 256:
        return int(value)
    number = NUMBERS.get(value)
    if number in NFT_PROTOCOLS:
        return number
    raise FirewallError(f'unknown protocol "{value}" specified')


def _option_block(toks: _Tokens) -> Iterator[tuple[str, bool]]:
    """Yield (option, inverted) until the next -m/-j/-g; values are taken by the caller."""
    while True:
        start = toks.pos
        invert = toks.take_invert()
        tok = toks.peek()
        if tok is None or tok in ("-m", "-j", "-g", "-s", "-d", "-i", "-o", "-p"):
            toks.pos = start  # the caller's loop re-reads any "!" with the option it negates
            return
        toks.pos += 1
        yield tok, invert


def _parse_match(name: str, toks: _Tokens, proto: object) -> MatchSpec:
    if name in ("tcp", "udp"):
        if not isinstance(proto, Proto) or proto.invert or PROTO_NAMES.get(proto.number) != name:
            raise FirewallError(f"-m {name} needs `-p {name}' before it")
        return _parse_ports(name, toks)
    if name == "multiport":
        return _parse_multiport(toks)
    if name == "owner":
        return _parse_owner(toks)
    if name == "comment":
        return _parse_comment(toks)
    raise FirewallError(f"unsupported match -m {name}")


def _parse_ports(name: str, toks: _Tokens) -> PortMatch:
    found: dict[str, tuple[PortRange, bool]] = {}
    for opt, invert in _option_block(toks):
        if opt not in ("--sport", "--dport") or opt in found:
            raise FirewallError(f"unsupported option {opt} for -m {name}")
        found[opt] = (parse_port_range(toks.take(opt), Syntax.IPTABLES), invert)
    if not found:  # iptables-nft writes nothing for it, so it could never be read back
        raise FirewallError(f"-m {name} without --sport or --dport")
    sport, sinv = found.get("--sport", (None, False))
    dport, dinv = found.get("--dport", (None, False))
    return PortMatch(name, sport, sinv, dport, dinv)


def _parse_multiport(toks: _Tokens) -> Multiport:
    found: list[Multiport] = []
    for opt, invert in _option_block(toks):
        if opt not in MULTIPORT_FLAGS or found:
            raise FirewallError(f"unsupported option {opt} for -m multiport")
        items = toks.take(opt).split(",")
        ports = tuple(parse_port_range(item, Syntax.IPTABLES) for item in items)
        if sum(p.slots for p in ports) > MULTIPORT_MAX:
            raise FirewallError("too many ports specified")
        found.append(Multiport(opt, ports, invert))
    if not found:
        raise FirewallError("multiport needs one of --sports, --dports or --ports")
    return found[0]


def _parse_id_range(text: str) -> IdRange:
    low, sep, high = text.partition("-")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise FirewallError(f'Bad owner id "{text}"')
    first, last = int(low), int(high) if sep else int(low)
    if last > 0xFFFFFFFE or first > last:
        raise FirewallError(f'Bad owner id "{text}"')
    return (first, last)


def _parse_owner(toks: _Tokens) -> Owner:
    ids: dict[str, tuple[IdRange, bool]] = {}
    socket: list[bool] = []
    for opt, invert in _option_block(toks):
        if opt in ("--uid-owner", "--gid-owner") and opt not in ids:
            ids[opt] = (_parse_id_range(toks.take(opt)), invert)
        elif opt == "--socket-exists" and not socket:
            socket.append(invert)
        else:
            raise FirewallError(f"unsupported option {opt} for -m owner")
    if not ids and not socket:
        raise FirewallError("owner: at least one of --uid-owner, --gid-owner, --socket-exists")
    uid, uinv = ids.get("--uid-owner", (None, False))
    gid, ginv = ids.get("--gid-owner", (None, False))
    return Owner(uid, uinv, gid, ginv, bool(socket), bool(socket and socket[0]))


def _parse_comment(toks: _Tokens) -> Comment:
    found: list[str] = []
    for opt, invert in _option_block(toks):
        if opt != "--comment" or invert or found:
            raise FirewallError(f"unsupported option {opt} for -m comment")
        found.append(toks.take(opt))
    if not found:
        raise FirewallError("comment: --comment is required")
    if len(found[0].encode()) >= COMMENT_LEN:
        raise FirewallError("COMMENT must be shorter than 256 characters")
    if "\0" in found[0]:  # the kernel would keep only the text before it
        raise FirewallError("a comment cannot contain a NUL character")
    return Comment(found[0])


def _parse_target(flag: str, name: str, toks: _Tokens) -> TargetSpec:
    if flag == "-j" and name == "REDIRECT":
        return _parse_redirect(toks)
    if not name or (flag == "-g" and name in VERDICT_CODES) or len(name) > 28:
        raise FirewallError(f"invalid target {flag} {name}")
    return Verdict(name, goto=flag == "-g")


def _parse_redirect(toks: _Tokens) -> Redirect:
    ports: PortRange | None = None
    random = False
    for opt, invert in _option_block(toks):
        if opt == "--to-ports" and ports is None and not invert:
            ports = parse_port_range(toks.take(opt), Syntax.TO_PORTS)
        elif opt == "--random" and not random and not invert:
            random = True
        else:
            raise FirewallError(f"unsupported option {opt} for -j REDIRECT")
    return Redirect(ports, random)


# --- RuleSpec -> tokens (what iptables-nft-save prints) --------------------------------------


def render_spec_tokens(spec: RuleSpec) -> tuple[str, ...]:
    out: list[str] = []
    for opt, address in (("-s", spec.source), ("-d", spec.destination)):
        if address is not None:
            out += [*_bang(address.invert), opt, format_network(address.network)]
    for opt, iface in (("-i", spec.in_iface), ("-o", spec.out_iface)):
        if iface is not None:
            out += [*_bang(iface.invert), opt, iface.name]
    if spec.proto is not None:
        out += [*_bang(spec.proto.invert), "-p", proto_name(spec.proto.number)]
    for match in spec.matches:
        out += _render_match(match)
    if spec.target is not None:
        out += _render_target(spec.target)
    return tuple(out)


def _bang(invert: bool) -> list[str]:
    return ["!"] if invert else []


def proto_name(number: int) -> str:
    if number not in PROTO_NAMES:
        raise FirewallError(f"protocol {number} is not supported by the nft codec")
    return PROTO_NAMES[number]


def _render_ids(ids: IdRange) -> str:
    return str(ids[0]) if ids[0] == ids[1] else f"{ids[0]}-{ids[1]}"


def _render_match(match: MatchSpec) -> list[str]:
    match match:
        case PortMatch(proto, sport, sinv, dport, dinv):
            out = ["-m", proto]
            if sport is not None:
                out += [*_bang(sinv), "--sport", sport.render(":")]
            if dport is not None:
                out += [*_bang(dinv), "--dport", dport.render(":")]
            return out
        case Multiport(option, ports, invert):
            text = ",".join(p.render(":") for p in ports)
            return ["-m", "multiport", *_bang(invert), option, text]
        case Owner():
            return ["-m", "owner", *_render_owner(match)]
        case Comment(text):
            return ["-m", "comment", "--comment", text]
    raise FirewallError(f"cannot render match {match!r}")


def _render_owner(owner: Owner) -> list[str]:
    out: list[str] = []
    if owner.socket_exists:
        out += [*_bang(owner.socket_invert), "--socket-exists"]
    if owner.uid is not None:
        out += [*_bang(owner.uid_invert), "--uid-owner", _render_ids(owner.uid)]
    if owner.gid is not None:
        out += [*_bang(owner.gid_invert), "--gid-owner", _render_ids(owner.gid)]
    return out


def _render_target(target: TargetSpec) -> list[str]:
    if isinstance(target, Verdict):
        return ["-g" if target.goto else "-j", target.name]
    if isinstance(target, Notrack):
        return ["-j", "CT", "--notrack"]  # as iptables-nft-save prints it
    out = ["-j", "REDIRECT"]
    if target.ports is not None:
        out += ["--to-ports", target.ports.render("-")]
    if target.random:
        out.append("--random")
    return out


def canonical_spec(tokens: Sequence[str], family: Family) -> RuleSpec:
    """parse_spec, insisting that the tokens are already what iptables-nft-save prints.

    `-p all` is the one accepted non-canonical form (it matches everything and prints as
    nothing). Anything else that would print differently is refused, so a rule model never
    disagrees with the dump of what it wrote.
    """
    spec = parse_spec(tokens, family)
    wanted = tuple(_without_p_all(tokens))
    printed = render_spec_tokens(spec)
    if printed != wanted:
        raise FirewallError(
            f"rule is not in iptables-save canonical form: {' '.join(tokens)!r} "
            f"would be saved as {' '.join(printed)!r}"
        )
    return spec


def _without_p_all(tokens: Sequence[str]) -> Iterator[str]:
    it = iter(range(len(tokens)))
    for i in it:
        if tokens[i] == "-p" and i + 1 < len(tokens) and tokens[i + 1] in ("all", "0"):
            next(it, None)
            continue
        yield tokens[i]

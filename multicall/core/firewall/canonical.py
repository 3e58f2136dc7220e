"""The canonical form of an iptables rule: the key under which two spellings of one rule
compare equal.

This is the authoritative reader of the iptables token language (every spelling iptables
accepts, for any extension); docs/architecture.md, "The one rule format and its parsers".

Rules of this module:
1. Two rules compare equal when their canonical forms do. The canonical form undoes what the
   kernel and iptables-save change (docs/upstream-behaviour.md §A): option spellings
   (`--match`, `--protocol`, `--destination-port`, unambiguous prefixes such as `--to-port`),
   `/32` and `/128` on bare addresses, `-p all`, the implicit protocol match
   (`-p tcp --dport` == `-p tcp -m tcp --dport`), the position of `! -d` and `-o`, and the
   order of matches.
2. Order is kept where it changes meaning: matches around a stateful match (limit, recent,
   quota, ...), whose state depends on what was matched before it. Each option stays attached
   to the match (`-m`) or target (`-j`) that owns it, as iptables attributes it (target first,
   then the first match that knows the option, then the protocol's implicit match, else the
   most recent `-m`/`-j`).
3. What is not understood is compared as written (never equal by accident).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from multicall.core.firewall.protocols import SAVE_NAMES, protocol_number

# Short and long spellings of iptables' own (non-extension) options -> canonical short form.
_BASE = {
    "-p": "-p", "--protocol": "-p",
    "-s": "-s", "--source": "-s", "--src": "-s",
    "-d": "-d", "--destination": "-d", "--dst": "-d",
    "-i": "-i", "--in-interface": "-i",
    "-o": "-o", "--out-interface": "-o",
    "-f": "-f", "--fragment": "-f",
    "-m": "-m", "--match": "-m",
    "-j": "-j", "--jump": "-j",
    "-g": "-g", "--goto": "-g",
    "-c": "-c", "--set-counters": "-c",
    "-4": "-4", "--ipv4": "-4",
    "-6": "-6", "--ipv6": "-6",
}  # fmt: skip
_BASE_ARITY = {"-p": 1, "-s": 1, "-d": 1, "-i": 1, "-o": 1, "-f": 0, "-c": 2, "-4": 0, "-6": 0}

# The match iptables loads implicitly for `-p PROTO` when an option needs it.
_IMPLICIT_MATCH = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp6", 132: "sctp", 33: "dccp"}
_PORTS = ("--sport", "--source-port", "--dport", "--destination-port")
_MATCH_OPTIONS: dict[str, tuple[str, ...]] = {
    "tcp": (*_PORTS, "--tcp-flags", "--syn", "--tcp-option"),
    "udp": _PORTS,
    "sctp": (*_PORTS, "--chunk-types"),
    "dccp": (*_PORTS, "--dccp-types", "--dccp-option"),
    "icmp": ("--icmp-type",),
    "icmp6": ("--icmpv6-type",),
    "multiport": ("--sports", "--source-ports", "--dports", "--destination-ports", "--ports"),
    "owner": ("--uid-owner", "--gid-owner", "--socket-exists", "--suppl-groups"),
    "comment": ("--comment",),
    "state": ("--state",),
    "conntrack": (
        "--ctstate", "--ctproto", "--ctorigsrc", "--ctorigdst", "--ctreplsrc", "--ctrepldst",
        "--ctorigsrcport", "--ctorigdstport", "--ctreplsrcport", "--ctrepldstport",
        "--ctstatus", "--ctexpire", "--ctdir",
    ),
    "mark": ("--mark",),
    "addrtype": ("--src-type", "--dst-type", "--limit-iface-in", "--limit-iface-out"),
    "iprange": ("--src-range", "--dst-range"),
    "mac": ("--mac-source",),
    "limit": ("--limit", "--limit-burst"),
}  # fmt: skip
_TARGET_OPTIONS: dict[str, tuple[str, ...]] = {
    "REDIRECT": ("--to-ports", "--random"),
    "MASQUERADE": ("--to-ports", "--random", "--random-fully"),
    "DNAT": ("--to-destination", "--random", "--persistent"),
    "SNAT": ("--to-source", "--random", "--random-fully", "--persistent"),
    "TPROXY": ("--on-port", "--on-ip", "--tproxy-mark"),
    "REJECT": ("--reject-with",),
    "LOG": (
        "--log-level", "--log-prefix", "--log-tcp-sequence", "--log-tcp-options",
        "--log-ip-options", "--log-uid", "--log-macdecode",
    ),
    "MARK": ("--set-xmark", "--set-mark", "--and-mark", "--or-mark", "--xor-mark"),
    "ACCEPT": (), "DROP": (), "RETURN": (), "QUEUE": (),
}  # fmt: skip
_ALIASES = {
    "--source-port": "--sport",
    "--destination-port": "--dport",
    "--source-ports": "--sports",
    "--destination-ports": "--dports",
}
# Options that take exactly one value, even one starting with '-'.
_SINGLE_VALUE = frozenset({"--comment", "--log-prefix", "--nflog-prefix"})
_SET_VALUED = frozenset({"--state", "--ctstate", "--ctstatus"})
_SYN = ("FIN,SYN,RST,ACK", "SYN")
_TCP_FLAGS = ("FIN", "SYN", "RST", "PSH", "ACK", "URG")
# Matches that only look at the packet (and conntrack, read-only): their order is irrelevant.
# Any other match (limit, recent, quota, statistic, unknown ones) may keep state, so its
# position relative to the others is kept.
STATELESS_MATCHES = frozenset(
    {
        "tcp", "udp", "icmp", "icmp6", "sctp", "dccp", "multiport", "owner", "comment", "state",
        "conntrack", "mark", "addrtype", "iprange", "mac", "set", "physdev", "pkttype", "length",
        "ttl", "hl", "tos", "dscp", "ecn", "u32", "string", "connmark", "helper", "devgroup",
        "cgroup", "socket", "policy", "rpfilter", "realm", "cpu", "esp", "ah", "frag", "hbh",
        "dst", "rt", "ipv6header", "mh", "tcpmss", "connbytes", "time", "bpf", "ipvs", "",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True, order=True)
class Option:
    """One option of a rule in canonical form."""

    name: str
    negated: bool
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True, order=True)
class Match:
    """One match module of a rule with its options, in canonical form."""

    module: str
    options: tuple[Option, ...]


@dataclass(frozen=True, slots=True)
class CanonicalRule:
    """The comparison key of a rule: equal keys mean the kernel holds the same rule."""

    base: tuple[Option, ...]
    matches: tuple[Match, ...]
    verdict: str  # "-j", "-g" or "" (no target)
    target: str
    target_options: tuple[Option, ...]

    @property
    def spec(self) -> tuple[str, ...]:
        """The canonical form as an iptables-save-like spec (for display)."""
        out: list[str] = []
        for opt in self.base:
            out += _option_tokens(opt)
        for match in self.matches:
            out += ["-m", match.module]
            for opt in match.options:
                out += _option_tokens(opt)
        if self.verdict:
            out += [self.verdict, self.target]
            for opt in self.target_options:
                out += _option_tokens(opt)
        return tuple(out)


def _option_tokens(opt: Option) -> list[str]:
    return [*(["!"] if opt.negated else []), opt.name, *opt.values]


# ---------------------------------------------------------------------------------------------
# Canonicalisation


@dataclass(slots=True)
class _Owner:
    """A match or target being collected while a rule is canonicalised."""

    module: str
    known: tuple[str, ...] | None  # None: an extension this module does not know
    options: list[Option] = field(default_factory=list)


@dataclass(slots=True)
class _RuleBuilder:
    """The parts of one rule while it is canonicalised."""

    base: list[Option] = field(default_factory=list)
    matches: list[_Owner] = field(default_factory=list)
    verdict: str = ""
    target: _Owner | None = None
    last: _Owner | None = None
    protocol: int | None = None

    def owner_of(self, name: str) -> tuple[_Owner, str]:
        """Who takes `--name`, and the option's full spelling (iptables' attribution order)."""
        loaded = [self.target] if self.target else []
        # Loading a match again completes the earlier instances (xtables_find_match).
        latest = {owner.module: owner for owner in self.matches}.values()
        loaded += [owner for owner in self.matches if any(owner is x for x in latest)]
        # getopt_long sees the loaded extensions' options and prefers an exact name anywhere
        # over an abbreviation; only an option it does not know loads the protocol's match.
        for exact in (True, False):
            for owner in loaded:
                if owner.known is not None:
                    full = _resolve(name, owner.known, exact=exact)
                    if full is not None:
                        return owner, full
        implicit = _IMPLICIT_MATCH.get(self.protocol or -1)
        if implicit is not None:
            known = _MATCH_OPTIONS[implicit]
            full = _resolve(name, known, exact=True) or _resolve(name, known, exact=False)
            if full is not None:
                owner = _Owner(implicit, known)
                self.matches.append(owner)
                return owner, full
        if self.last is None:
            self.last = _Owner("", None)
            self.matches.append(self.last)
        return self.last, name

    def finish(self) -> CanonicalRule:
        target = self.target or _Owner("", ())
        return CanonicalRule(
            base=tuple(sorted(self.base)),
            matches=_order_matches(self.matches),
            verdict=self.verdict,
            target=target.module,
            target_options=tuple(sorted(target.options)),
        )


def _resolve(name: str, known: Sequence[str], *, exact: bool) -> str | None:
    """getopt_long's matching: an exact name, or a prefix of exactly one known option."""
    if name in known:
        return _ALIASES.get(name, name)
    if exact:
        return None
    hits = {_ALIASES.get(k, k) for k in known if k.startswith(name)}
    return hits.pop() if len(hits) == 1 else None


# libxt_limit: a rate is stored as a period in 1/10000 s; units are matched by prefix.
_LIMIT_SCALE = 10000
_LIMIT_UNITS = (("second", 1), ("minute", 60), ("hour", 3600), ("day", 86400))
_LIMIT_PRINT = (("day", 86400), ("hour", 3600), ("min", 60), ("sec", 1))
_LIMIT_DEFAULTS = (Option("--limit", False, ("3/hour",)), Option("--limit-burst", False, ("5",)))


def _limit_options(options: Sequence[Option]) -> list[Option]:
    """`-m limit` as iptables-save prints it: the rate in its unit, the default burst omitted,
    the default rate (3/hour) spelled out."""
    out = [_limit_rate(o) for o in options]
    if not any(o.name == "--limit" for o in out):
        out.append(_LIMIT_DEFAULTS[0])
    return [o for o in out if o != _LIMIT_DEFAULTS[1]]


def _limit_rate(option: Option) -> Option:
    if option.name != "--limit" or len(option.values) != 1:
        return option
    period = _limit_period(option.values[0])
    if period is None:
        return option
    name, unit = _limit_unit(period)
    return Option("--limit", option.negated, (f"{unit * _LIMIT_SCALE // period}/{name}",))


def _limit_unit(period: int) -> tuple[str, int]:
    """print_rate's choice: the largest unit before one the period does not fit well."""
    for i in range(1, len(_LIMIT_PRINT)):
        mult = _LIMIT_PRINT[i][1] * _LIMIT_SCALE
        if period > mult or mult // period < mult % period:
            return _LIMIT_PRINT[i - 1]
    return _LIMIT_PRINT[-1]


def _limit_period(rate: str) -> int | None:
    number, slash, unit = rate.partition("/")
    mult = 1
    if slash:
        found = [m for name, m in _LIMIT_UNITS if unit and name.startswith(unit.lower())]
        if not found:
            return None
        mult = found[0]
    if not (number.isascii() and number.isdigit() and 0 < len(number) <= 10):
        return None
    count = int(number)
    period = _LIMIT_SCALE * mult // count if count else 0
    return period if 0 < period < 2**32 else None


def _order_matches(owners: Sequence[_Owner]) -> tuple[Match, ...]:
    """Sort matches, except that a stateful match keeps its place relative to all others."""
    out: list[Match] = []
    run: list[Match] = []
    for owner in owners:
        options = _limit_options(owner.options) if owner.module == "limit" else owner.options
        match = Match(owner.module, tuple(sorted(options)))
        if owner.module not in STATELESS_MATCHES:
            out += sorted(run)
            out.append(match)
            run = []
        else:
            run.append(match)
    return (*out, *sorted(run))


def canonical(spec: Sequence[str]) -> CanonicalRule:
    """The canonical form of a rule spec (the tokens after `-A CHAIN`)."""
    rule = _RuleBuilder()
    tokens = list(spec)
    i = 0
    negated = False
    while i < len(tokens):
        word = tokens[i]
        if word == "!":
            negated = True
            i += 1
            continue
        base = _BASE.get(word)
        if base is not None:
            i = _take_base(rule, base, tokens, i + 1, negated)
        elif word.startswith("--"):
            i = _take_option(rule, word, tokens, i + 1, negated)
        else:  # a stray word: keep it, in place, so it can never compare equal by accident
            _stray(rule, word, negated)
            i += 1
        negated = False
    return rule.finish()


def _stray(rule: _RuleBuilder, token: str, negated: bool) -> None:
    if rule.last is None:
        rule.last = _Owner("", None)
        rule.matches.append(rule.last)
    rule.last.options.append(Option(token, negated, ()))


def _take_base(rule: _RuleBuilder, name: str, tokens: list[str], i: int, negated: bool) -> int:
    if name in ("-m", "-j", "-g"):
        value = tokens[i] if i < len(tokens) else ""
        if name == "-m":
            owner = _Owner(value, _MATCH_OPTIONS.get(value))
            rule.matches.append(owner)
        else:
            owner = _Owner(value, _TARGET_OPTIONS.get(value))
            rule.target, rule.verdict = owner, name
        rule.last = owner
        return i + 1
    arity = _BASE_ARITY[name]
    if name in ("-c", "-4", "-6"):
        return i + arity
    if arity and tokens[i : i + 1] == ["!"]:  # `-d ! 1.2.3.4`, the pre-1.4.3 syntax
        negated, i = True, i + 1
    values = tuple(tokens[i : i + arity])
    rule.base.extend(_base_option(rule, name, negated, values))
    return i + arity


def _base_option(
    rule: _RuleBuilder, name: str, negated: bool, values: tuple[str, ...]
) -> list[Option]:
    if name == "-p" and values:
        number = protocol_number(values[0])
        if number is None:
            return [Option(name, negated, values)]
        if not negated:
            rule.protocol = number
        if number == 0 and not negated:
            return []
        return [Option(name, negated, (SAVE_NAMES.get(number, str(number)),))]
    if name in ("-s", "-d") and values:
        return [Option(name, negated, (_address(values[0]),))]
    return [Option(name, negated, values)]


def _address(value: str) -> str:
    """`10.0.0.1` -> `10.0.0.1/32`, `10.1.2.3/255.0.0.0` -> `10.0.0.0/8`, `::1` -> `::1/128`."""
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        return value  # a hostname, a list or a non-contiguous mask: compared as written


def _take_option(rule: _RuleBuilder, name: str, tokens: list[str], i: int, negated: bool) -> int:
    owner, full = rule.owner_of(name)
    values, i = _option_values(full, tokens, i)
    if values[:1] == ("!",) and len(values) > 1:
        negated, values = True, values[1:]
    if full == "--syn" and owner.module == "tcp":
        full, values = "--tcp-flags", _SYN
    if full == "--tcp-flags" and owner.module == "tcp":
        values = tuple(_tcp_flags(v) for v in values)
    if full in _SET_VALUED:
        values = tuple(",".join(sorted(v.split(","))) for v in values)
    owner.options.append(Option(full, negated, values))
    return i


def _tcp_flags(value: str) -> str:
    """A flag set as libxt_tcp prints it: kernel bit order, ALL expanded, NONE when empty."""
    names = set(value.upper().split(","))
    if "ALL" in names:
        names = (names - {"ALL"}) | set(_TCP_FLAGS)
    names.discard("NONE")
    if not names <= set(_TCP_FLAGS):
        return value  # not a flag list iptables would accept: compared as written
    return ",".join(f for f in _TCP_FLAGS if f in names) or "NONE"


def _option_values(name: str, tokens: list[str], i: int) -> tuple[tuple[str, ...], int]:
    if name in _SINGLE_VALUE:
        return tuple(tokens[i : i + 1]), i + 1
    start = i
    if i < len(tokens) and tokens[i] == "!" and i + 1 < len(tokens):
        i += 1  # old-style `--dport ! 80`
    while i < len(tokens) and not _is_option(tokens, i):
        i += 1
    return tuple(tokens[start:i]), i


def _is_option(tokens: list[str], i: int) -> bool:
    word = tokens[i]
    if word == "!":
        return i + 1 < len(tokens) and tokens[i + 1].startswith("-")
    return len(word) > 1 and word.startswith("-") and not word[1:2].isdigit()

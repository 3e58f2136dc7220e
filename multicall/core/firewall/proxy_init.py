"""Linkerd's PROXY_INIT rule set as data: port parsing, the upstream argv, canonical rules, the
change against an existing nat table, the table it leads to, and iptables-restore text.

Rules of this module (docs/upstream-behaviour.md §3-4, §11):
1. Port lists are parsed as upstream's Go does (`strconv.Atoi`, `L-U` ranges, 0..65535):
   invalid items are dropped and reported, never fatal, except that a non-empty list whose
   items are all invalid yields upstream's empty `--dports ""` rule, which iptables rejects;
   that rejection is reproduced here as a `FirewallError` carrying iptables' message.
2. Every rule is built once as a `Step` holding both shapes: the argv upstream passes to
   `iptables -A` and the canonical spec `iptables-save` prints for it. The argv list and the
   rules therefore cannot drift apart.
3. Chains are created when missing and flushed when present; a jump from PREROUTING/OUTPUT is
   appended only when none matches upstream's regex, so re-applying never duplicates jumps.
4. Errors the real iptables binary would raise while parsing a command (`Step.error`) surface
   when canonical rules are requested, first one in command order, before anything is applied.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from multicall.core.firewall.model import (
    COMMENT_LEN,
    OUTPUT_CHAIN,
    REDIRECT_CHAIN,
    Family,
    Mode,
    ProxyInitOptions,
    TableChange,
)
from multicall.core.firewall.ports import MULTIPORT_SLOTS, Syntax, is_port, parse_port_range
from multicall.core.firewall.ruleset import (
    BUILTIN_CHAINS,
    Chain,
    Rule,
    Table,
    format_network,
    render_rule,
    save_order,
)
from multicall.core.go.net import parse_cidr
from multicall.errors import FirewallError

TABLE = "nat"
COMMENT_PREFIX = "proxy-init/"
# The iptables release whose messages (and save format) the fixtures pin down.
XTABLES_VERSION = "1.8.9"
OWNER_ID_MAX = 4294967294  # libxt_owner accepts 0..UINT32_MAX-1


# ----------------------------------------------------------------------------- ports


@dataclass(frozen=True, slots=True)
class InvalidPort:
    """A port or range upstream drops (with a log line) instead of failing."""

    item: str
    reason: str

    def message(self) -> str:
        """The line upstream logs (at error level) for a dropped item."""
        return f'invalid port configuration of "{self.item}": {self.reason}'


@dataclass(frozen=True, slots=True)
class PortGroups:
    """Multiport destinations: each group is one `--dports` value; dropped items beside."""

    groups: tuple[tuple[str, ...], ...]
    invalid: tuple[InvalidPort, ...] = ()


def group_ports(items: Sequence[str]) -> PortGroups:
    """upstream makeMultiportDestinations: 15 slots per group, invalid items skipped.

    A non-empty list whose items are all invalid gives one empty group (upstream's quirk).
    """
    if not items:
        return PortGroups(())
    groups: list[tuple[str, ...]] = []
    current: list[str] = []
    used = 0
    invalid: list[InvalidPort] = []
    for item in items:
        try:
            port_range = parse_port_range(item, Syntax.LINKERD)
        except ValueError as exc:
            invalid.append(InvalidPort(item, str(exc)))
            continue
        if used + port_range.slots > MULTIPORT_SLOTS:
            groups.append(tuple(current))
            current, used = [], 0
        current.append(port_range.render())
        used += port_range.slots
    groups.append(tuple(current))
    return PortGroups(tuple(groups), tuple(invalid))


def invalid_ports(options: ProxyInitOptions) -> tuple[InvalidPort, ...]:
    """Every dropped port item of both lists (for logging, as upstream does)."""
    inbound = group_ports(options.inbound_ports_to_ignore).invalid
    return inbound + group_ports(options.outbound_ports_to_ignore).invalid


# ----------------------------------------------------------------------------- subnets


def parse_subnet(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """Go net.ParseCIDR after TrimSpace: an address, `/`, decimal prefix; host bits allowed."""
    trimmed = text.strip()
    parsed = parse_cidr(trimmed)
    if parsed is None:
        raise FirewallError(f"{trimmed} is not a valid CIDR address")
    address, prefix = parsed
    return ipaddress.ip_network(f"{address}/{prefix}", strict=False)


def validate_options(options: ProxyInitOptions) -> ProxyInitOptions:
    """upstream BuildFirewallConfiguration: proxy ports in range, subnets parse (trimmed).

    Returns the options with trimmed subnets, as upstream hands them to iptables.
    """
    if not is_port(options.incoming_proxy_port):
        raise FirewallError("--incoming-proxy-port must be a valid TCP port number")
    if not is_port(options.outgoing_proxy_port):
        raise FirewallError("--outgoing-proxy-port must be a valid TCP port number")
    for subnet in options.subnets_to_ignore:
        parse_subnet(subnet)
    trimmed = tuple(s.strip() for s in options.subnets_to_ignore)
    return replace(options, subnets_to_ignore=trimmed)


# ----------------------------------------------------------------------------- steps


@dataclass(frozen=True, slots=True)
class Step:
    """One upstream `-A CHAIN ...` command and the rule `iptables-save` shows for it.

    `error` is what the real iptables answers instead (the command then changes nothing).
    """

    chain: str
    argv: tuple[str, ...]
    spec: tuple[str, ...]
    error: str | None = None

    @property
    def rule(self) -> Rule:
        return Rule(self.chain, self.spec)


def _comment(text: str) -> tuple[str, ...]:
    """upstream's `--comment`, as the kernel keeps it: iptables cuts it to 255 bytes. Only
    a subnet's text can be that long (a zero-padded prefix, `/000…08`, which Go accepts
    and upstream writes as given); every comment is ASCII, so the cut splits no character."""
    full = COMMENT_PREFIX + text
    return ("-m", "comment", "--comment", full.encode()[: COMMENT_LEN - 1].decode(errors="ignore"))


def ignore_ports_step(chain: str, group: tuple[str, ...]) -> Step:
    dports = ",".join(group)
    comment = _comment(f"ignore-port-{dports}")
    argv = ("-p", "tcp", "--match", "multiport", "--dports", dports, "-j", "RETURN", *comment)
    spec = ("-p", "tcp", "-m", "multiport", "--dports", dports, *comment, "-j", "RETURN")
    error = None if dports else "invalid port/service `' specified"
    return Step(chain, argv, spec, error)


def ignore_subnet_step(chain: str, subnet: str, family: Family) -> Step:
    comment = _comment(f"ignore-subnet-{subnet}")
    argv = ("-p", "all", "-j", "RETURN", "-s", subnet, *comment)
    network = parse_subnet(subnet)
    wanted = 4 if family is Family.IPV4 else 6
    if network.version != wanted:
        address = subnet.partition("/")[0]
        return Step(chain, argv, (), f"host/network `{address}' not found")
    # iptables-save omits a zero-length source match altogether.
    source = ("-s", format_network(network)) if network.prefixlen else ()
    return Step(chain, argv, (*source, *comment, "-j", "RETURN"))


def redirect_all_step(chain: str, to_port: int, text: str) -> Step:
    comment = _comment(text)
    argv = ("-p", "tcp", "-j", "REDIRECT", "--to-port", str(to_port), *comment)
    spec = ("-p", "tcp", *comment, "-j", "REDIRECT", "--to-ports", str(to_port))
    return Step(chain, argv, spec)


def redirect_port_step(chain: str, port: int, to_port: int) -> Step:
    comment = _comment(f"redirect-port-{port}-to-proxy-port")
    target = ("-j", "REDIRECT")
    argv: tuple[str, ...] = ("-p", "tcp", "--destination-port", str(port), *target)
    argv += ("--to-port", str(to_port), *comment)
    spec: tuple[str, ...] = ("-p", "tcp", "-m", "tcp", "--dport", str(port), *comment)
    spec += (*target, "--to-ports", str(to_port))
    error = None if is_port(port) else f"invalid port/service `{port}' specified"
    return Step(chain, argv, spec, error)


def ignore_owner_step(chain: str, option: str, value: int, text: str) -> Step:
    comment = _comment(text)
    argv = ("-m", "owner", option, str(value), "-j", "RETURN", *comment)
    spec = ("-m", "owner", option, str(value), *comment, "-j", "RETURN")
    error = None
    if value > OWNER_ID_MAX:
        error = f'owner: Bad value for "{option}" option: "{value}"'
    return Step(chain, argv, spec, error)


def ignore_loopback_step(chain: str) -> Step:
    comment = _comment("ignore-loopback")
    argv = ("-o", "lo", "-j", "RETURN", *comment)
    return Step(chain, argv, ("-o", "lo", *comment, "-j", "RETURN"))


def jump_step(chain: str, target: str, text: str) -> Step:
    comment = _comment(text)
    return Step(chain, ("-j", target, *comment), (*comment, "-j", target))


PREROUTING_JUMP = jump_step("PREROUTING", REDIRECT_CHAIN, "install-proxy-init-prerouting")
OUTPUT_JUMP = jump_step("OUTPUT", OUTPUT_CHAIN, "install-proxy-init-output")


def subnets_of_family(subnets: Sequence[str], family: Family) -> tuple[str, ...]:
    """The subnets one family's pass ignores: those written in its own address family, as
    linkerd2-proxy-init#696 filters them. Upstream without #696 hands every subnet to both
    passes and the other family's iptables fails (``host/network `10.0.0.0' not found``), so
    a dual-stack pod with IPv4 skip-subnets could not start (docs/linkerd-cni.md). Unlike
    #696 (Go's `To4()`), an IPv4-mapped `::ffff:a.b.c.d` network stays with IPv6: only
    ip6tables accepts that notation, so #696 would move it to a pass that fails."""
    return tuple(s for s in subnets if (parse_subnet(s).version == 6) == (family is Family.IPV6))


def redirect_steps(options: ProxyInitOptions, family: Family) -> tuple[Step, ...]:
    """PROXY_INIT_REDIRECT's rules, in upstream order."""
    steps = [
        ignore_ports_step(REDIRECT_CHAIN, g)
        for g in group_ports(options.inbound_ports_to_ignore).groups
    ]
    subnets = subnets_of_family(options.subnets_to_ignore, family)
    steps += [ignore_subnet_step(REDIRECT_CHAIN, s, family) for s in subnets]
    to_port = options.incoming_proxy_port
    if options.ports_to_redirect:
        steps += [redirect_port_step(REDIRECT_CHAIN, p, to_port) for p in options.ports_to_redirect]
    else:
        steps.append(
            redirect_all_step(REDIRECT_CHAIN, to_port, "redirect-all-incoming-to-proxy-port")
        )
    return tuple(steps)


def output_steps(options: ProxyInitOptions) -> tuple[Step, ...]:
    """PROXY_INIT_OUTPUT's rules, in upstream order."""
    steps = []
    if options.proxy_uid > 0:
        steps.append(
            ignore_owner_step(
                OUTPUT_CHAIN, "--uid-owner", options.proxy_uid, "ignore-proxy-user-id"
            )
        )
    if options.proxy_gid > 0:
        steps.append(
            ignore_owner_step(
                OUTPUT_CHAIN, "--gid-owner", options.proxy_gid, "ignore-proxy-group-id"
            )
        )
    steps.append(ignore_loopback_step(OUTPUT_CHAIN))
    steps += [
        ignore_ports_step(OUTPUT_CHAIN, g)
        for g in group_ports(options.outbound_ports_to_ignore).groups
    ]
    steps.append(
        redirect_all_step(
            OUTPUT_CHAIN, options.outgoing_proxy_port, "redirect-all-outgoing-to-proxy-port"
        )
    )
    return tuple(steps)


# ----------------------------------------------------------------------------- existing state

_JUMP_RES = {
    "PREROUTING": re.compile(r"^-A PREROUTING (.+ )?-j PROXY_INIT_REDIRECT"),
    "OUTPUT": re.compile(r"^-A OUTPUT (.+ )?-j PROXY_INIT_OUTPUT"),
}
JUMP_CHAINS = tuple(_JUMP_RES)  # the built-in chains ADD may add a jump to


def has_chain(existing: Table | None, name: str) -> bool:
    return existing is not None and existing.chain(name) is not None


def has_jump(existing: Table | None, chain: str) -> bool:
    """upstream's multiline regex over the save text, applied to each rendered rule."""
    if existing is None:
        return False
    pattern = _JUMP_RES[chain]
    return any(pattern.match(render_rule(r)) for r in existing.rules_of(chain))


# ----------------------------------------------------------------------------- argv


def binaries(mode: Mode, family: Family) -> tuple[str, str]:
    """(rule binary, save binary) upstream runs for a mode and family (§4.1)."""
    base = {Mode.LEGACY: "iptables-legacy", Mode.NFT: "iptables-nft", Mode.PLAIN: "iptables"}
    name = base[mode]
    if family is Family.IPV6:
        name = "ip6" + name[2:]
    return name, f"{name}-save"


def build_argv(
    options: ProxyInitOptions,
    family: Family,
    *,
    mode: Mode = Mode.LEGACY,
    existing: Table | None = None,
) -> tuple[tuple[str, ...], ...]:
    """The rule-changing commands upstream runs, in order (the `*.argv.jsonl` fixtures).

    `existing` is the nat table its first `iptables-save -t nat` would show (None: empty,
    as in simulate mode). Commands after a failing one are listed too, as upstream builds
    them all before running any; the real run stops at the first failure.
    """
    options = validate_options(options)
    binary = binaries(mode, family)[0]
    wait = ("-w",) if options.use_wait_flag else ()
    commands = []
    for chain, steps, jump in _chains(options, family):
        verb = "-F" if has_chain(existing, chain) else "-N"
        commands.append((binary, "-t", TABLE, verb, chain, *wait))
        commands += [(binary, "-t", TABLE, "-A", s.chain, *s.argv, *wait) for s in steps]
        if not has_jump(existing, jump.chain):
            commands.append((binary, "-t", TABLE, "-A", jump.chain, *jump.argv, *wait))
    return tuple(commands)


def build_run_argv(
    options: ProxyInitOptions,
    family: Family,
    *,
    mode: Mode,
    netns: str,
    existing: Table | None = None,
) -> tuple[tuple[str, ...], ...]:
    """A whole upstream run as it is exec'd: nsenter-wrapped, between two `-save -t nat`."""
    save = (binaries(mode, family)[1], "-t", TABLE)
    inner = (save, *build_argv(options, family, mode=mode, existing=existing), save)
    return tuple(("nsenter", f"--net={netns}", "--", *argv) for argv in inner)


def _chains(
    options: ProxyInitOptions, family: Family
) -> tuple[tuple[str, tuple[Step, ...], Step], ...]:
    return (
        (REDIRECT_CHAIN, redirect_steps(options, family), PREROUTING_JUMP),
        (OUTPUT_CHAIN, output_steps(options), OUTPUT_JUMP),
    )


# ----------------------------------------------------------------------------- canonical rules


def error_message(error: str, family: Family, backend: str) -> str:
    """iptables' own first line for a parse error, e.g. `iptables v1.8.9 (legacy): ...`."""
    tool = "iptables" if family is Family.IPV4 else "ip6tables"
    flavour = "nf_tables" if backend == "nft" else "legacy"
    return f"{tool} v{XTABLES_VERSION} ({flavour}): {error}"


def _raise_step_error(step: Step, family: Family, backend: str) -> None:
    assert step.error is not None
    tool = "iptables" if family is Family.IPV4 else "ip6tables"
    raise FirewallError(
        error_message(step.error, family, backend),
        table=TABLE,
        chain=step.chain,
        details=f"Try `{tool} -h' or '{tool} --help' for more information.",
    )


def build_rules(
    options: ProxyInitOptions, family: Family, *, backend: str = "legacy"
) -> dict[str, tuple[Rule, ...]]:
    """Canonical rules per chain: both PROXY_INIT chains and the two jump rules.

    Raises FirewallError for invalid options and for the first command iptables would
    reject (its message, flavoured by `backend`: "legacy" or "nft").
    """
    options = validate_options(options)
    rules: dict[str, tuple[Rule, ...]] = {}
    for chain, steps, jump in _chains(options, family):
        for step in (*steps, jump):
            if step.error is not None:
                _raise_step_error(step, family, backend)
        rules[chain] = tuple(s.rule for s in steps)
        rules[jump.chain] = (jump.rule,)
    return rules


def plan_change(
    existing: Table, options: ProxyInitOptions, family: Family, *, backend: str = "legacy"
) -> TableChange:
    """What one upstream run does to `existing`, as one transaction."""
    rules = build_rules(options, family, backend=backend)
    create: list[str] = []
    flush: list[str] = []
    append: list[Rule] = []
    for chain, jump in ((REDIRECT_CHAIN, PREROUTING_JUMP), (OUTPUT_CHAIN, OUTPUT_JUMP)):
        (flush if has_chain(existing, chain) else create).append(chain)
        append += rules[chain]
        if not has_jump(existing, jump.chain):
            append.append(jump.rule)
    return TableChange(TABLE, tuple(create), tuple(flush), tuple(append))


# ----------------------------------------------------------------------------- tables


def empty_table(name: str = TABLE) -> Table:
    """A freshly instantiated table: built-in chains with ACCEPT policies, no rules."""
    return Table(name, tuple(Chain(c, "ACCEPT") for c in BUILTIN_CHAINS[name]))


def apply_change(table: Table, change: TableChange) -> Table:
    """The table after `change` (create, flush, append), in save order."""
    chains = {c.name: c for c in table.chains}
    for name in change.create_chains:
        chains.setdefault(name, Chain(name))
    flushed = set(change.flush_chains) | set(change.create_chains)
    kept = [r for r in table.rules if r.chain not in flushed]
    rules = _group_by_chain([*kept, *change.append], save_order(table.name, set(chains)))
    ordered = tuple(chains[n] for n in save_order(table.name, set(chains)) if n in chains)
    return Table(table.name, ordered, rules)


def _group_by_chain(rules: Iterable[Rule], order: Sequence[str]) -> tuple[Rule, ...]:
    listed = list(rules)
    return tuple(r for name in order for r in listed if r.chain == name)


def expected_table(
    options: ProxyInitOptions,
    family: Family,
    existing: Table | None = None,
    *,
    backend: str = "legacy",
) -> Table:
    """The nat table after applying `options` to `existing` (default: a fresh netns)."""
    base = existing if existing is not None else empty_table()
    return apply_change(base, plan_change(base, options, family, backend=backend))


def strip_counters(table: Table) -> Table:
    """The table without chain/rule counters, for comparing a live dump with a model."""
    chains = tuple(replace(c, counters=None) for c in table.chains)
    rules = tuple(replace(r, counters=None) for r in table.rules)
    return Table(table.name, chains, rules)

"""The nftables mode against the iptables modes, by traffic: every derived linkerd-iptables
scenario (and a few option variants) programmed once by the scenario's iptables backend and
once natively, each in a pod netns of its own joined to a peer netns by a veth pair, then
the same connections (inbound from the peer to app, ignored and redirected ports, from a
source inside and outside the skipped subnets, over IPv4 and IPv6; outbound as the proxy's
uid, gid, both and neither, to ignored and other ports, and over loopback) must land on the
same listeners. The real `nft` lists the native tables as cnibox renders them, and every
batch the mode sends decodes to native expressions only (no `match`/`target`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from subprocess import Popen

import pytest

from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.nft import netlink
from multicall.core.firewall.nft.batch import Batch
from multicall.core.firewall.nft.expr import XtMatch, XtTarget, decode_exprs
from multicall.core.firewall.nft.native import native_table, render
from multicall.effects.firewall import nft as nft_effects
from multicall.effects.firewall.engine import apply_proxy_init, dump_native
from multicall.errors import FirewallError
from tests.support.libcni import TCP_PROBE
from tests.support.rig import Netns, Rig, unique_name
from tests.support.scenarios import (
    ERROR_NAMES,
    OK_NAMES,
    scenario_family,
    scenario_mode,
    scenario_options,
)

pytestmark = pytest.mark.netns

PROBE = Path(__file__).parents[1] / "support" / "traffic_probe.py"
V4, V6 = Family.IPV4, Family.IPV6
POD_PORTS = (4143, 4140, 7777, 8080, 9090, 4191, 4190, 25, 587, 590, 591, 22, 23, 56, 443)
PEER_PORTS = (9999, 443, 6443, 3306, 3307, 5432)
# (uid, gid) of outbound connections: neither the proxy's, its gid only, its uid only, both.
IDS = ((1000, 1000), (1000, 2102), (2102, 1000), (2102, 2102))
VARIANTS = {
    "variant-gid-only-custom-ports": ProxyInitOptions(
        incoming_proxy_port=4190, outgoing_proxy_port=4191, proxy_uid=0, proxy_gid=2102,
        outbound_ports_to_ignore=("3306-3307",),
    ),
    "variant-redirect-ports-and-subnet": ProxyInitOptions(
        ports_to_redirect=(7777, 22), inbound_ports_to_ignore=("22",),
        subnets_to_ignore=(" 172.30.0.0/16",),
    ),
    "variant-invalid-inbound-items-dropped": ProxyInitOptions(
        inbound_ports_to_ignore=("4191", "nope", "70000"), outbound_ports_to_ignore=("6443",),
    ),
    # 32,768 ports: one set of single ports natively, 2,185 multiport rules in iptables
    "variant-every-odd-port-ignored-outbound": ProxyInitOptions(
        outbound_ports_to_ignore=tuple(str(p) for p in range(1, 65536, 2)),
        inbound_ports_to_ignore=("4191", "4190", "20-25", "587", "588-589"),
    ),
}  # fmt: skip


@dataclass
class Site:
    """A pod netns and a peer netns on one veth link: 10.77.N.0/24 (inside 10.0.0.0/8),
    172.30.N.0/24 (outside it) and fd77:N::/64, the pod at .2/::2, the peer at .1/::1."""

    pod: Netns
    peer: Netns
    n: int
    listeners: list[Popen[str]] = field(default_factory=list)

    def v4(self, net: int, host: int) -> str:
        return f"10.77.{self.n}.{host}" if net == 10 else f"172.30.{self.n}.{host}"

    def v6(self, host: int) -> str:
        return f"fd77:{self.n}::{host}"


def make_site(rig: Rig, n: int) -> Site:
    pod, peer = rig.netns("p"), rig.netns("q")
    veth = unique_name("v")[-15:]
    peer.ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pod.name)
    site = Site(pod, peer, n)
    for ns, dev, host in ((pod, "eth0", 2), (peer, veth, 1)):
        ns.ip("addr", "add", f"{site.v4(10, host)}/24", "dev", dev)
        ns.ip("addr", "add", f"{site.v4(172, host)}/24", "dev", dev)
        ns.ip("addr", "add", f"{site.v6(host)}/64", "dev", dev, "nodad")
        ns.ip("link", "set", dev, "up")
    for ns, ports in ((pod, POD_PORTS), (peer, PEER_PORTS)):
        proc = ns.popen([sys.executable, str(TCP_PROBE), "listen-dual", *map(str, ports)])
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        site.listeners.append(proc)
    return site


def stop(site: Site) -> None:
    for proc in site.listeners:
        proc.kill()
        proc.communicate()


def probe(ns: Netns, cases: Sequence[tuple[str, int, int | None, int | None]]) -> list[str]:
    out = ns.exec([sys.executable, str(PROBE), "connect", json.dumps(cases)])
    found: list[str] = json.loads(out)
    return found


def traffic(site: Site) -> dict[str, str]:
    """Every case's outcome (the port of the listener the connection landed on), by a key
    naming the addresses by role, so that two sites compare."""
    pod = {"pod-10/8": site.v4(10, 2), "pod-172": site.v4(172, 2), "pod-v6": site.v6(2)}
    inbound = [(name, host, port) for name, host in pod.items() for port in POD_PORTS[2:]]
    targets = (
        ("peer-v4", site.v4(10, 1), PEER_PORTS),
        ("peer-v6", site.v6(1), PEER_PORTS[:3]),
        ("loopback-v4", "127.0.0.1", (7777,)),
        ("loopback-v6", "::1", (7777,)),
        ("own-address", site.v4(10, 2), (7777,)),  # over lo as well
    )
    outbound = [
        (f"{name} as {uid}:{gid}", host, port, uid, gid)
        for uid, gid in IDS
        for name, host, ports in targets
        for port in ports
    ]
    results = {}
    Case = tuple[str, int, int | None, int | None]
    cases: list[Case] = [(host, port, None, None) for _, host, port in inbound]
    for (name, _, port), outcome in zip(inbound, probe(site.peer, cases), strict=True):
        results[f"in {name}:{port}"] = outcome
    cases = [(host, port, uid, gid) for _, host, port, uid, gid in outbound]  # as the proxy or not
    for (name, _, port, _, _), outcome in zip(outbound, probe(site.pod, cases), strict=True):
        results[f"out {name}:{port}"] = outcome
    return results


@pytest.fixture
def sites(rig: Rig) -> Iterator[tuple[Site, Site]]:
    made: list[Site] = []
    try:
        made = [make_site(rig, 1 + (rig.subnet_octet + i) % 250) for i in range(2)]
        yield made[0], made[1]
    finally:
        for site in made:
            stop(site)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Batch]:
    """Every batch any nf_tables call of the test sends."""
    batches: list[Batch] = []
    real = nft_effects._send_batch

    def spy(sock: nft_effects._Socket, batch: Batch, *, grow_receive: bool = True) -> object:
        batches.append(batch)
        return real(sock, batch, grow_receive=grow_receive)

    monkeypatch.setattr(nft_effects, "_send_batch", spy)
    return batches


def compat_in(batch: Batch) -> list[str]:
    """The names of the `match`/`target` expressions of a batch's NEWRULE messages."""
    found = []
    for msg in netlink.parse_messages(batch.data):
        if isinstance(msg, netlink.Message) and msg.msg_type == netlink.nft_type(
            netlink.NFT_MSG_NEWRULE
        ):
            exprs = decode_exprs(netlink.attr_map(msg.body)[netlink.NFTA_RULE_EXPRESSIONS])
            found += [type(e).__name__ for e in exprs if isinstance(e, XtMatch | XtTarget)]
    return found


def families_for(options: ProxyInitOptions, family: Family) -> tuple[Family, ...]:
    """Both families unless an IPv4 subnet is skipped (the IPv6 pass refuses it)."""
    if family is V6 or not options.subnets_to_ignore:
        return (V4, V6)
    return (V4,)


CASES = [
    *[(name, scenario_options(name), scenario_mode(name), scenario_family(name))
      for name in OK_NAMES],
    *[(name, options, Mode.NFT, V4) for name, options in VARIANTS.items()],
    # dual stack with subnets of both families: a set per family, each its own family's
    # subnets (10/8 and 11/8 merge to 10.0.0.0/7), as the iptables mode's two passes
    ("variant-dual-stack-subnet-sets", ProxyInitOptions(
        subnets_to_ignore=("10.0.0.0/8", "11.0.0.0/8", "fd77::/16", "fe80::/10"),
     ), Mode.NFT, V6),
]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "mode", "family"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_native_mode_redirects_like_the_iptables_mode(
    sites: tuple[Site, Site],
    sent: list[Batch],
    options: ProxyInitOptions,
    mode: Mode,
    family: Family,
) -> None:
    reference, native = sites
    wanted = families_for(options, family)
    apply_proxy_init(reference.pod.path, options, mode=mode, families=wanted)
    sent.clear()
    apply_proxy_init(native.pod.path, options, mode=Mode.NFTABLES, families=wanted)
    assert len(sent) == 1  # one transaction for the pod, all families
    assert compat_in(sent[0]) == []
    for fam in (V4, V6):  # the real nft lists exactly what cnibox renders and expects
        word = "ip" if fam is V4 else "ip6"
        listed = native.pod.exec(["nft", "list", "table", word, "linkerd-proxy-init"], check=False)
        expected = render(native_table(options, fam), fam) if fam in wanted else None
        assert (listed.splitlines() or None) == expected
        assert render(dump_native(native.pod.path, family=fam), fam) == render(
            native_table(options, fam) if fam in wanted else None, fam
        )

    got, want = traffic(native), traffic(reference)
    assert got == want
    # The proof must be able to fail: the proxy ports were reached, and not by everything.
    landed = set(want.values())
    assert {str(options.incoming_proxy_port), str(options.outgoing_proxy_port)} <= landed
    assert {"7777", "9999"} <= landed


def test_reapplying_the_native_mode_is_idempotent(sites: tuple[Site, Site]) -> None:
    site = sites[0]
    options = scenario_options("full-legacy-wait")
    other = replace(options, ports_to_redirect=(), proxy_gid=0)
    apply_proxy_init(site.pod.path, other, mode=Mode.NFTABLES, families=(V4,))
    for _ in range(2):
        apply_proxy_init(site.pod.path, options, mode=Mode.NFTABLES, families=(V4,))
    listed = site.pod.exec(["nft", "list", "table", "ip", "linkerd-proxy-init"])
    assert listed.splitlines() == render(native_table(options, V4), V4)


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_native_mode_refuses_what_the_iptables_mode_refuses(
    sites: tuple[Site, Site], name: str
) -> None:
    options, family = scenario_options(name), scenario_family(name)
    wanted = (V4, V6) if family is V6 else (V4,)
    errors = []
    for site, mode in zip(sites, (scenario_mode(name), Mode.NFTABLES), strict=True):
        with pytest.raises(FirewallError) as caught:
            apply_proxy_init(site.pod.path, options, mode=mode, families=wanted)
        errors.append(caught.value.message)
        assert site.pod.exec(["nft", "list", "ruleset"]).strip() == ""  # nothing programmed
    assert errors[0] == errors[1]


def test_a_65535_port_list_is_one_batch_the_kernel_takes(
    sites: tuple[Site, Site], sent: list[Batch]
) -> None:
    """Every port ignored outbound one by one (a plain set of 65,535) and a range with every
    other port after it inbound (an interval set of 32,766 ranges): one batch of about 2.5 MB
    (16 bytes a plain element, 24 an interval end), accepted whole, listed by nft as rendered,
    read back equal."""
    site = sites[0]
    options = ProxyInitOptions(
        outbound_ports_to_ignore=tuple(str(p) for p in range(1, 65536)),
        inbound_ports_to_ignore=("1-3", *(str(p) for p in range(6, 65536, 2))),
    )
    sent.clear()
    apply_proxy_init(site.pod.path, options, mode=Mode.NFTABLES, families=(V4,))
    ((batch,),) = (sent,)
    assert len(batch.data) < 3 * 2**20
    expected = render(native_table(options, V4), V4)
    assert len([line for line in expected if "dport {" in line]) == 2
    listed = site.pod.exec(["nft", "list", "table", "ip", "linkerd-proxy-init"])
    assert listed.splitlines() == expected
    assert render(dump_native(site.pod.path, family=V4), V4) == expected

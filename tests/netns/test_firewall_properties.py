"""Hypothesis laws of the firewall engine, checked in throwaway netns against the real tools.

1. model -> apply -> dump round-trips, whatever was applied before (chains are replaced).
2. model -> restore text -> real `*-restore --noflush` prints, through the real `*-save`,
   exactly what model -> apply prints.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.proxy_init import (
    empty_table,
    expected_table,
    plan_change,
)
from multicall.core.firewall.proxy_init import strip_counters as bare
from multicall.core.firewall.ruleset import render_table
from multicall.effects.firewall.engine import backend_for, dump_nat
from multicall.effects.ns import entered_netns
from tests.support import require_tool
from tests.support.oracles import MODES, oracle
from tests.support.rig import Rig
from tests.support.rulesets import render_restore

pytestmark = pytest.mark.netns

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

ports = st.integers(0, 65535)
port_items = st.one_of(
    ports.map(str),
    st.tuples(ports, ports).map(lambda t: f"{min(t)}-{max(t)}"),
)
invalid_items = st.sampled_from(["abc", " 80", "5-", "-1", "70000", "1-2-3", "9-8"])


def _mix(drawn: tuple[list[str], str | None, int]) -> tuple[str, ...]:
    """Valid items, sometimes with an invalid one mixed in (never only invalid ones)."""
    items, bad, at = drawn
    if items and bad is not None:
        items.insert(min(at, len(items)), bad)
    return tuple(items)


# Up to 20 items, enough to split multiport groups at 15 slots.
port_lists = st.tuples(
    st.lists(port_items, max_size=20), st.none() | invalid_items, st.integers(0, 20)
).map(_mix)


ipv4_subnets = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 32)).map(
    lambda t: f"{ipaddress.IPv4Address(t[0])}/{t[1]}"
)


ipv6_addresses = st.one_of(
    st.integers(0, 2**128 - 1),
    st.integers(0, 2**32 - 1).map(lambda v: (0xFFFF << 32) | v),  # IPv4-mapped
    st.integers(1 << 16, 2**32 - 1),  # IPv4-compatible
)
ipv6_subnets = st.tuples(ipv6_addresses, st.integers(0, 128)).map(
    lambda t: f"{ipaddress.IPv6Address(t[0])}/{t[1]}"
)


def option_sets(family: Family) -> st.SearchStrategy[ProxyInitOptions]:
    return st.builds(
        ProxyInitOptions,
        incoming_proxy_port=ports,
        outgoing_proxy_port=ports,
        proxy_uid=st.integers(-1, 70000),
        proxy_gid=st.integers(-1, 70000),
        ports_to_redirect=st.lists(ports, max_size=3).map(tuple),
        inbound_ports_to_ignore=port_lists,
        outbound_ports_to_ignore=port_lists,
        subnets_to_ignore=st.lists(
            ipv4_subnets if family is Family.IPV4 else ipv6_subnets, max_size=3
        ).map(tuple),
        use_wait_flag=st.booleans(),
    )


def apply_one_family(path: str, options: ProxyInitOptions, mode: Mode, family: Family) -> None:
    """What apply_proxy_init does for one family (IPv6 subnets would fail its IPv4 pass)."""
    with entered_netns(path):
        backend = backend_for(mode, family)
        change = plan_change(backend.dump(family, "nat"), options, family, backend=backend.name)
        backend.apply(family, change)


def restore_tool(mode: Mode, family: Family) -> str:
    prefix = "iptables" if family is Family.IPV4 else "ip6tables"
    flavour = "legacy" if mode is Mode.LEGACY else "nft"
    return require_tool(f"{prefix}-{flavour}-restore")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.value)
def test_apply_dump_round_trip(rig: Rig, mode: Mode, family: Family) -> None:
    """Applied over whatever came before, the dump is the model of the last options."""
    pod = rig.netns("p")

    @SETTINGS
    @given(options=option_sets(family))
    def law(options: ProxyInitOptions) -> None:
        apply_one_family(pod.path, options, mode, family)
        model = expected_table(options, family)
        assert bare(dump_nat(pod.path, mode=mode, family=family)) == bare(model)
        assert oracle(pod, mode, family) == render_table(model).splitlines()

    law()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.value)
def test_restore_text_equals_apply(rig: Rig, mode: Mode, family: Family) -> None:
    """The model's restore text, fed to the real restore tool, matches the engine's apply."""

    @SETTINGS
    @given(options=option_sets(family))
    def law(options: ProxyInitOptions) -> None:
        restored, applied = rig.netns("r"), rig.netns("a")
        try:
            text = render_restore(plan_change(empty_table(), options, family))
            restored.exec([restore_tool(mode, family), "--noflush"], input_=text)
            apply_one_family(applied.path, options, mode, family)
            assert oracle(restored, mode, family) == oracle(applied, mode, family)
        finally:
            rig.remove(restored)
            rig.remove(applied)

    law()

"""plugin/recording.py (the one recording firewall) and plugin/expected.py (the one expected
table for a pod), with the seam's in-memory firewall underneath."""

from __future__ import annotations

import pytest

from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.proxy_init import empty_table, expected_table
from multicall.effects.ns import NetnsRef
from multicall.errors import FirewallError
from multicall.plugin.expected import expected_for_pod
from multicall.plugin.recording import Programmed, RecordingFirewall
from tests.support.fakes import MemoryFirewall

NETNS = NetnsRef("/var/run/netns/pod")
FAMILIES = (Family.IPV4,)


def test_records_what_apply_programmed_and_passes_reads_through() -> None:
    inner = MemoryFirewall()
    firewall = RecordingFirewall(inner)
    options = ProxyInitOptions()
    firewall.apply(NETNS, options, mode=Mode.LEGACY, families=FAMILIES, log=lambda _: None)
    assert firewall.programmed == Programmed(NETNS, options, Mode.LEGACY, FAMILIES)
    assert inner.applied == [firewall.programmed]
    dumped = firewall.dump_nat(NETNS, mode=Mode.LEGACY, family=Family.IPV4, log=lambda _: None)
    assert dumped == inner.table(NETNS.path, Family.IPV4)


def test_a_refused_apply_records_nothing() -> None:
    firewall = RecordingFirewall(MemoryFirewall(refusal="iptables-restore: line 3 failed"))
    with pytest.raises(FirewallError):
        firewall.apply(
            NETNS, ProxyInitOptions(), mode=Mode.NFT, families=FAMILIES, log=lambda _: None
        )
    assert firewall.programmed is None


def test_expected_for_pod_is_adds_table_or_a_fresh_one() -> None:
    options = ProxyInitOptions()
    assert expected_for_pod(options, Family.IPV6) == expected_table(options, Family.IPV6)
    assert expected_for_pod(None, Family.IPV4) == empty_table()

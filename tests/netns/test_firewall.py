"""The firewall engine in throwaway netns, judged by Debian's real `*-save` tools.

Every scenario of fixtures/derived/linkerd-iptables runs through both backends (the nft
fixtures' bodies equal the legacy ones), IPv4 and IPv6, and the oracle's `*nat` body must
equal the fixture line for line.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from multicall.core.firewall.model import (
    OUTPUT_CHAIN,
    REDIRECT_CHAIN,
    Family,
    Mode,
    ProxyInitOptions,
    families,
)
from multicall.core.firewall.proxy_init import (
    expected_table,
    plan_change,
    strip_counters,
)
from multicall.core.firewall.ruleset import Rule, render_table
from multicall.effects.firewall.engine import apply_proxy_init, backend_for, dump_nat
from multicall.effects.ns import entered_netns
from multicall.errors import FirewallError, NetnsError
from tests.support import REPO, require_tool
from tests.support.oracles import MODES, oracle, save_tool
from tests.support.rig import Netns, Rig
from tests.support.scenarios import (
    ERROR_NAMES,
    OK_NAMES,
    fixture_body,
    fixture_error,
    scenario_family,
    scenario_options,
    times_applied,
)

pytestmark = pytest.mark.netns

V4_ONLY = families(ipv6=False)

DEFAULT = ProxyInitOptions(inbound_ports_to_ignore=("4191", "4190"))


def apply(ns: Netns, options: ProxyInitOptions, mode: Mode, *, ipv6: bool = False) -> None:
    apply_proxy_init(ns.path, options, mode=mode, families=families(ipv6=ipv6))


def model_body(options: ProxyInitOptions, family: Family) -> list[str]:
    return render_table(expected_table(options, family)).splitlines()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
class TestScenarios:
    @pytest.mark.parametrize("name", OK_NAMES)
    def test_oracle_equals_fixture(self, rig: Rig, mode: Mode, name: str) -> None:
        """Applied N times, the real save tool prints the fixture's body."""
        pod = rig.netns("p")
        options, family = scenario_options(name), scenario_family(name)
        for _ in range(times_applied(name)):
            apply(pod, options, mode, ipv6=family is Family.IPV6)
        assert oracle(pod, mode, family) == fixture_body(name)

    @pytest.mark.parametrize("name", OK_NAMES)
    def test_dump_equals_model(self, rig: Rig, mode: Mode, name: str) -> None:
        """The backend's own dump is the rule model that produced it."""
        pod = rig.netns("p")
        options, family = scenario_options(name), scenario_family(name)
        apply(pod, options, mode, ipv6=family is Family.IPV6)
        dumped = dump_nat(pod.path, mode=mode, family=family)
        assert strip_counters(dumped) == strip_counters(expected_table(options, family))

    @pytest.mark.parametrize("name", ERROR_NAMES)
    def test_error_leaves_tables_unchanged(self, rig: Rig, mode: Mode, name: str) -> None:
        """Error scenarios fail with iptables' message and change neither family."""
        pod = rig.netns("p")
        apply(pod, DEFAULT, mode, ipv6=True)
        before = [oracle(pod, mode, f) for f in Family]
        options = scenario_options(name)
        with pytest.raises(FirewallError) as info:
            apply(pod, options, mode, ipv6=True)
        expected = fixture_error(name)
        if mode is Mode.LEGACY:
            expected = expected.replace("(nf_tables)", "(legacy)")
        assert str(info.value) == expected
        assert [oracle(pod, mode, f) for f in Family] == before


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
class TestReapply:
    def test_twice(self, rig: Rig, mode: Mode) -> None:
        """Applying twice leaves exactly one jump per built-in chain."""
        pod = rig.netns("p")
        apply(pod, DEFAULT, mode)
        apply(pod, DEFAULT, mode)
        body = oracle(pod, mode, Family.IPV4)
        assert body == model_body(DEFAULT, Family.IPV4)
        assert sum(line.startswith("-A PREROUTING") for line in body) == 1

    def test_a_then_b(self, rig: Rig, mode: Mode) -> None:
        """B over A gives B's rules (chains replaced, jumps not repeated)."""
        pod = rig.netns("p")
        a = ProxyInitOptions(proxy_gid=3, subnets_to_ignore=("10.0.0.0/8",), ports_to_redirect=(1,))
        b = ProxyInitOptions(outbound_ports_to_ignore=("443", "6443"), use_wait_flag=True)
        apply(pod, a, mode)
        apply(pod, b, mode)
        assert oracle(pod, mode, Family.IPV4) == model_body(b, Family.IPV4)

    def test_foreign_rules_survive(self, rig: Rig, mode: Mode) -> None:
        """Rules another tool put in the nat table stay where they were."""
        pod = rig.netns("p")
        tool = save_tool(mode, Family.IPV4).removesuffix("-save")
        pod.exec([tool, "-t", "nat", "-A", "POSTROUTING", "-o", "lo", "-j", "ACCEPT"])
        apply(pod, DEFAULT, mode)
        body = oracle(pod, mode, Family.IPV4)
        assert "-A POSTROUTING -o lo -j ACCEPT" in body
        assert f":{REDIRECT_CHAIN} - [0:0]" in body


FOREIGN_RULES = {
    Family.IPV4: [
        "-N X",
        "-N Y",
        "-A X ! -d 127.0.0.1 -o lo -j RETURN",
        "-A X -s 10.1.2.3 -i eth+ -p 47 -g Y",
        "-A X -d 10.0.0.0/255.0.255.0 -p udp --dport 53 -j DNAT --to-destination 10.9.9.9:5353",
        """-A X -p tcp ! --syn -m comment --comment 'it'"'"'s "q" \\'"""
        " -j MASQUERADE --to-ports 1000-2000",
        "-A OUTPUT -m multiport -p tcp ! --dports 1:3,7 -j Y",
    ],
    Family.IPV6: [
        "-N X",
        "-A X -s fd00::1/64 ! -d ::ffff:10.0.0.1 -j RETURN",
        "-A X -p tcp -m tcp --dport 80 -j REDIRECT",
        "-A PREROUTING -p 58 -j X",
    ],
}


@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.value)
def test_legacy_dump_prints_like_save(rig: Rig, family: Family) -> None:
    """Rules written by the real iptables-legacy dump exactly as iptables-legacy-save prints."""
    pod = rig.netns("p")
    tool = save_tool(Mode.LEGACY, family).removesuffix("-save")
    for args in FOREIGN_RULES[family]:
        pod.exec([tool, "-t", "nat", *shlex.split(args)])
    dumped = dump_nat(pod.path, mode=Mode.LEGACY, family=family)
    assert render_table(dumped).splitlines() == oracle(pod, Mode.LEGACY, family)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_kernel_refusal_changes_nothing(rig: Rig, mode: Mode) -> None:
    """A change the kernel rejects at commit (REDIRECT hooked from INPUT) leaves no trace."""
    pod = rig.netns("p")
    apply(pod, DEFAULT, mode)
    before = oracle(pod, mode, Family.IPV4)
    applied = expected_table(DEFAULT, Family.IPV4)
    change = plan_change(applied, ProxyInitOptions(proxy_gid=9), Family.IPV4)
    bad = Rule("INPUT", ("-p", "tcp", "-j", "REDIRECT", "--to-ports", "1"))
    change = replace(change, create_chains=("NEW",), append=(*change.append, bad))
    with entered_netns(pod.path), pytest.raises(FirewallError):
        backend_for(mode, Family.IPV4).apply(Family.IPV4, change)
    assert oracle(pod, mode, Family.IPV4) == before


class TestSafety:
    def test_refuses_own_netns(self, rig: Rig) -> None:
        """From inside a netns, programming that same netns is refused unless allowed."""
        pod = rig.netns("p")
        script = textwrap.dedent(
            """
            from multicall.core.firewall.model import Mode, ProxyInitOptions, families
            from multicall.effects.firewall.engine import apply_proxy_init
            from multicall.effects.ns import NetnsRef
            from multicall.errors import NetnsError
            own = "/proc/self/ns/net"
            v4 = families(ipv6=False)
            try:
                apply_proxy_init(own, ProxyInitOptions(), mode=Mode.LEGACY, families=v4)
            except NetnsError as exc:
                print("refused:", exc)
            allowed = NetnsRef(own, allow_own=True)
            apply_proxy_init(allowed, ProxyInitOptions(), mode=Mode.LEGACY, families=v4)
            """
        )
        out = pod.exec([sys.executable, "-c", script])
        assert out.startswith("refused: /proc/self/ns/net is the caller's own network namespace")
        assert f":{OUTPUT_CHAIN} - [0:0]" in oracle(pod, Mode.LEGACY, Family.IPV4)

    def test_stdout_not_duplicated(self, rig: Rig) -> None:
        """Output buffered before a legacy apply is written once (the CNI result is stdout)."""
        pod = rig.netns("p")
        script = (
            "import sys;"
            "from multicall.core.firewall.model import Mode, ProxyInitOptions, families;"
            "from multicall.effects.firewall.engine import apply_proxy_init;"
            f"apply = lambda: apply_proxy_init({pod.path!r}, ProxyInitOptions(),"
            " mode=Mode.LEGACY, families=families(ipv6=True));"
            "apply();"
            "sys.stdout.write('before ');"
            "apply();"  # its dump decodes rules, and python-iptables flushes stdout then
            "sys.stdout.write('after')"
        )
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
        )
        assert (proc.returncode, proc.stdout) == (0, "before after"), proc.stderr

    def test_a_thread_holding_stdout_at_the_fork_does_not_hang_legacy(self, rig: Rig) -> None:
        """In a threaded caller (the repair controller logs to stdout from other threads), a
        thread may hold stdout's lock when the legacy backend forks; the child, which flushes
        stdout before each extension's save, must not wait for it (it would wait for ever)."""
        pod = rig.netns("p")
        script = textwrap.dedent(
            f"""
            import os, sys, threading, time
            from multicall.core.firewall.model import Family, Mode, ProxyInitOptions, families
            from multicall.effects.firewall.legacy import isolation
            from multicall.effects.firewall.engine import apply_proxy_init, dump_nat
            apply_proxy_init({pod.path!r}, ProxyInitOptions(), mode=Mode.LEGACY,
                             families=families(ipv6=False))  # rules whose dump saves matches
            read_end, write_end = os.pipe()
            os.dup2(write_end, 1)
            sys.stdout = open(1, "w", buffering=1 << 16)
            isolation._flush_std_streams = lambda: None  # the lock is taken after that flush
            def log():
                sys.stdout.write("x" * (1 << 20))  # fills the pipe: blocks holding the lock
                sys.stdout.flush()
            threading.Thread(target=log, daemon=True).start()
            time.sleep(0.3)
            table = dump_nat({pod.path!r}, mode=Mode.LEGACY, family=Family.IPV4)
            os.write(2, f"{{len(table.chains)}} chains".encode())
            os._exit(0)  # the logging thread still holds stdout: no flush at exit
            """
        )
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a hung libiptc child is killed with its parent
        )
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("the legacy backend's child hung on stdout's lock")
        assert (proc.returncode, err) == (0, b"6 chains")

    def test_missing_netns(self) -> None:
        """A netns path that does not exist is a NetnsError, before anything else."""
        with pytest.raises(NetnsError, match="no such network namespace"):
            apply_proxy_init("/run/netns/cbx-absent", DEFAULT, mode=Mode.LEGACY, families=V4_ONLY)

    @pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
    def test_no_host_binary(self, rig: Rig, mode: Mode, tmp_path: Path) -> None:
        """With PATH empty and every exec traced, the apply runs no program at all."""
        strace = require_tool("strace")
        pod = rig.netns("p")
        empty = tmp_path / "empty"
        empty.mkdir()
        trace = tmp_path / "trace"
        script = (
            "from multicall.core.firewall.model import Mode, ProxyInitOptions, families;"
            "from multicall.effects.firewall.engine import apply_proxy_init;"
            f"apply_proxy_init({pod.path!r}, ProxyInitOptions(), mode=Mode.{mode.name},"
            " families=families(ipv6=True))"
        )
        argv = [strace, "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace)]
        argv += [sys.executable, "-c", script]
        env = {"PATH": str(empty), "PYTHONPATH": str(REPO)}
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        execs = [line for line in trace.read_text().splitlines() if "execve" in line]
        assert len(execs) == 1, execs  # the interpreter itself
        assert oracle(pod, mode, Family.IPV6) == model_body(ProxyInitOptions(), Family.IPV6)


class TestPlainDetection:
    def test_prefers_legacy_with_rules(self, rig: Rig) -> None:
        """`plain` picks legacy when legacy already holds rules in the netns."""
        pod = rig.netns("p")
        pod.exec([require_tool("iptables-legacy"), "-t", "filter", "-A", "INPUT", "-j", "ACCEPT"])
        log: list[str] = []
        apply_proxy_init(pod.path, DEFAULT, mode=Mode.PLAIN, families=V4_ONLY, log=log.append)
        assert any("using legacy" in line for line in log)
        assert oracle(pod, Mode.LEGACY, Family.IPV4) == model_body(DEFAULT, Family.IPV4)

    def test_otherwise_nft(self, rig: Rig) -> None:
        """Without legacy rules, `plain` uses nf_tables."""
        pod = rig.netns("p")
        log: list[str] = []
        apply_proxy_init(pod.path, DEFAULT, mode=Mode.PLAIN, families=V4_ONLY, log=log.append)
        assert any("using nft" in line for line in log)
        assert oracle(pod, Mode.NFT, Family.IPV4) == model_body(DEFAULT, Family.IPV4)


# A single-use process (a node agent's worker, with its legacy.SingleUse): it counts the
# children the legacy backend forks, then prints each family's nat body as the backend dumps it.
SINGLE_USE = """
import sys
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions, families
from multicall.core.firewall.ruleset import render_table
from multicall.effects.firewall.legacy import isolation
from multicall.effects.firewall.engine import apply_proxy_init, dump_nat
from multicall.errors import ServeElsewhere
path, ipv6 = sys.argv[1], sys.argv[2] == "ipv6"
single = isolation.SingleUse()
forks = []
real = isolation.run_isolated
isolation.run_isolated = lambda work: forks.append(1) or real(work)
options = ProxyInitOptions(inbound_ports_to_ignore=("4191", "4190"))
for _ in range(2):  # the second apply dumps (and decodes) the first one's rules
    apply_proxy_init(
        path, options, mode=Mode.LEGACY, families=families(ipv6=ipv6), single_use=single
    )
print(len(forks))
try:
    other = Family.IPV4 if ipv6 else Family.IPV6
    print(len(dump_nat(path, mode=Mode.LEGACY, family=other, single_use=single).rules))
except ServeElsewhere as exc:
    print(exc.reason)
"""


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "dual-stack"])
def test_single_use_process_applies_one_family_in_process(rig: Rig, ipv6: bool) -> None:
    """A single-use process (legacy.SingleUse, the agent's worker) runs an apply of one family
    without forking, with the same tables; dual-stack still forks a child per operation
    (libxtables registers an extension for the family of its first load only). After an
    in-process apply, the process refuses the other family instead of forking a child that
    could not load its extensions: it hands it back (an agent's caller then runs one-shot)."""
    pod = rig.netns("p")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", SINGLE_USE, pod.path, "ipv6" if ipv6 else "ipv4"],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    forks, other = proc.stdout.splitlines()
    for family in families(ipv6=ipv6):
        assert oracle(pod, Mode.LEGACY, family) == model_body(DEFAULT, family)
    if ipv6:
        assert (forks, other) == ("8", str(len(expected_table(DEFAULT, Family.IPV4).rules)))
    else:
        assert forks == "0"
        assert other == "x_tables extensions of the other family loaded"

"""pytest's fixtures and hooks for every suite: the netns rig, the session's PKI, and the
guard that the machine's own firewall is never changed. Helpers live in tests/support/.

Suites by what a test needs: tests/pure/ (Python and cnibox only), tests/tools/ (host tools
or compilers: go, openssl, skopeo, umoci), tests/netns/ (root and throwaway network
namespaces), tests/binary/ (the built single file, `make test-binary`), tests/cri/ (the built
file under containerd, driven through its CRI; docs/cri-tests.md).
`CNIBOX=/path/to/binary` runs the command-level suites against a built executable instead
of `python -m multicall`. `CNIBOX_TEST_AGENT=1` (with CNIBOX) runs them all with a node agent
serving the session (`cnibox agent`, CNIBOX_AGENT_SOCKET pointing at it); without it, no
agent is used even if one runs on the machine (CNIBOX_AGENT_SOCKET="").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.support import require_root, require_tool
from tests.support.pki import Pki, make_pki
from tests.support.rig import Rig


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """One CA and server certificate (openssl CLI) for every test API server of the run."""
    require_tool("openssl")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session", autouse=True)
def private_xtables_lock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The run's legacy ADDs and Debian's iptables-legacy share a lock file of their own
    (XTABLES_LOCKFILE, inherited by every child): other test runs on the same machine hold
    /run/xtables.lock at moments, and an ADD without the wait flag fails at once against
    them (docs/hardening.md §5)."""
    previous = os.environ.get("XTABLES_LOCKFILE")
    os.environ["XTABLES_LOCKFILE"] = str(tmp_path_factory.mktemp("xtables") / "xtables.lock")
    yield
    if previous is None:
        del os.environ["XTABLES_LOCKFILE"]
    else:
        os.environ["XTABLES_LOCKFILE"] = previous


@pytest.fixture
def rig() -> Iterator[Rig]:
    require_root()
    r = Rig()
    try:
        yield r
    finally:
        r.cleanup()


def _host_firewall() -> str:
    out = []
    for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save"):
        if shutil.which(tool):
            out.append(subprocess.run([tool], capture_output=True, text=True, check=False).stdout)
    # Counters move with the host's own traffic; only the rules themselves must stay put.
    lines = (line for text in out for line in text.splitlines() if not line.startswith("#"))
    return "\n".join(re.sub(r"\[\d+:\d+\]", "[-]", line) for line in lines)


def agent_mode() -> bool:
    return os.environ.get("CNIBOX_TEST_AGENT", "") == "1"


@pytest.fixture(scope="session", autouse=True)
def session_agent(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The agent every plugin invocation of the session goes through, in agent mode. A
    session that ran the libcni suite must have been served by it (not silently by the
    fallback)."""
    if not agent_mode():
        os.environ["CNIBOX_AGENT_SOCKET"] = ""
        yield
        return
    binary = os.environ.get("CNIBOX")
    if not binary or os.geteuid() != 0:
        pytest.exit("CNIBOX_TEST_AGENT=1 needs CNIBOX (the built file) and root", returncode=2)
    from tests.support.agent import AgentProcess

    run_dir = tmp_path_factory.mktemp("agent")
    agent = AgentProcess(run_dir / "agent.sock", argv=[binary]).start()
    os.environ["CNIBOX_AGENT_SOCKET"] = agent.socket
    try:
        yield
    finally:
        metrics = agent.metrics()
        served = sum(v for k, v in metrics.items() if "requests_total" in k)
        # A file the launcher refused (agent/caller_files.py) falls back silently: the
        # result is right either way, so count it here, where it would otherwise hide.
        refused = {k: v for k, v in metrics.items() if "caller refused a file" in k and v}
        assert agent.stop() == 0, "".join(agent.log[-20:])
        print(f"\nsession agent served {served:.0f} requests")
    ran_libcni = any("test_linkerd_cni" in item.nodeid for item in request.session.items)
    assert served > 0 or not ran_libcni, "agent mode, but the agent served no request"
    assert not refused, f"the launcher refused files the agent asked for: {refused}"


@pytest.fixture(scope="session", autouse=True)
def host_firewall_untouched() -> Iterator[None]:
    """Fail the run if anything changed the machine's own firewall."""
    if os.geteuid() != 0:
        yield
        return
    before = _host_firewall()
    yield
    after = _host_firewall()
    assert before == after, "the machine's own firewall changed during the test run"

"""pytest's fixtures and hooks for every suite: the netns rig, the session's PKI, and the
guard that the machine's own firewall is never changed. Helpers live in tests/support/.

Suites by what a test needs: tests/pure/ (Python and cnibox only), tests/tools/ (host tools
or compilers: go, openssl, skopeo, umoci), tests/netns/ (root and throwaway network
namespaces), tests/binary/ (the built single file, `make test-binary`), tests/cri/ (the built
file under containerd, driven through its CRI; docs/cri-tests.md).
`CNIBOX=/path/to/binary` runs the command-level suites against a built executable instead
of `python -m multicall`. `CNIBOX_TEST_AGENT=1` (with CNIBOX) runs them all through a node
agent with every capability (the Talos service), `=chart` and `=chart-nft` through agents
confined to the chart's capabilities on their callers' network (tests/support/session_agents.py);
without it, no agent is used even if one runs on the machine (CNIBOX_AGENT_SOCKET="").
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
from tests.support.session_agents import CHART_HANDED_BACK, MODES, SessionAgents


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


def _host_firewall() -> str:
    out = []
    for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save"):
        if shutil.which(tool):
            out.append(subprocess.run([tool], capture_output=True, text=True, check=False).stdout)
    # Counters move with the host's own traffic; only the rules themselves must stay put.
    lines = (line for text in out for line in text.splitlines() if not line.startswith("#"))
    return "\n".join(re.sub(r"\[\d+:\d+\]", "[-]", line) for line in lines)


def agent_mode() -> str:
    """CNIBOX_TEST_AGENT: "" (no agent) or one of session_agents.MODES."""
    return os.environ.get("CNIBOX_TEST_AGENT", "")


@pytest.fixture(scope="session", autouse=True)
def session_agent(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionAgents | None]:
    """The agents every plugin invocation of the session goes through, in agent mode
    (tests/support/session_agents.py). A session that ran the libcni suite must have been
    served by them (not silently by the fallback), and a chart agent may hand back only
    what the chart's capabilities cannot serve."""
    mode = agent_mode()
    if not mode:
        os.environ["CNIBOX_AGENT_SOCKET"] = ""
        yield None
        return
    binary = os.environ.get("CNIBOX")
    if mode not in MODES or not binary or os.geteuid() != 0:
        pytest.exit(
            f"CNIBOX_TEST_AGENT={mode} needs CNIBOX (the built file), root, and one of "
            f"{', '.join(MODES)}",
            returncode=2,
        )
    agents = SessionAgents(mode, binary, tmp_path_factory.mktemp("agent"))
    try:
        yield agents.start()
    finally:
        metrics = agents.stop()
    served = sum(v for k, v in metrics.items() if k.startswith("cnibox_agent_requests_total{"))
    handed_back = {
        k.split('reason="', 1)[1].rstrip('"}'): int(v)
        for k, v in metrics.items()
        if k.startswith("cnibox_agent_fallbacks_total") and v
    }
    print(f"\nsession agents ({mode}, {agents.started} started) served {served:.0f} requests, "
          f"handed back {handed_back}")  # fmt: skip
    ran_libcni = any("test_linkerd_cni" in item.nodeid for item in request.session.items)
    assert served > 0 or not ran_libcni, "agent mode, but the agent served no request"
    # A file the launcher refused (agent/caller_files.py) falls back silently: the result
    # is right either way, so count it here, where it would otherwise hide.
    assert "caller refused a file" not in handed_back, handed_back
    if agents.per_node:
        assert set(handed_back) <= CHART_HANDED_BACK, handed_back


@pytest.fixture
def rig(session_agent: SessionAgents | None) -> Iterator[Rig]:
    require_root()
    r = Rig()
    if session_agent is not None:
        r.on_node, r.on_remove = session_agent.node_added, session_agent.node_removed
    try:
        yield r
    finally:
        r.cleanup()


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

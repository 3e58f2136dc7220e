"""The node agent under test: start one (the built file's, or from source), read its metrics.

`AgentProcess` runs `cnibox agent` in the test's own netns and mount namespace, the way a
DaemonSet pod with hostNetwork sees the node: its socket is wherever the test puts it, its
admin server on 127.0.0.1 (an ephemeral port, read from its log).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import urllib.request
from pathlib import Path

from tests.support import cnibox_argv

READY = re.compile(r"agent ready on ")
ADMIN = re.compile(r"admin endpoints on \S+ \(port (\d+)\)")

# The agent's capabilities as the chart renders them (packaging/helm: drop ALL, add NET_ADMIN;
# SYS_ADMIN too for the keeper, which is on by default), as setpriv prefixes: a root
# process's permitted and effective sets after exec are its bounding set.
CHART_CAPS = {
    "all (the Talos service)": [],
    "chart, nft, keeper off: NET_ADMIN": [
        "setpriv", "--inh-caps=-all", "--bounding-set=-all,+net_admin"
    ],
    "chart default: NET_ADMIN, SYS_ADMIN": [
        "setpriv", "--inh-caps=-all", "--bounding-set=-all,+net_admin,+sys_admin"
    ],
}  # fmt: skip


class AgentProcess:
    def __init__(
        self,
        socket_path: Path | str,
        *,
        argv: list[str] | None = None,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        preexec: list[str] | None = None,
        netns: str | None = None,
    ) -> None:
        self.socket = str(socket_path)
        self.netns = netns  # the agent's netns when not the test's own (its admin server)
        if netns is not None:
            preexec = ["ip", "netns", "exec", os.path.basename(netns), *(preexec or [])]
        self.argv = [
            *(preexec or []),
            *(argv or cnibox_argv()),
            "agent",
            "--socket",
            self.socket,
            "--admin-addr",
            "127.0.0.1:0",
            "--log-level",
            "debug",
            *(extra or []),
        ]
        self.env = {k: v for k, v in os.environ.items() if k != "CNIBOX_AGENT_SOCKET"}
        self.env.update(env or {})
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.log: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 60) -> AgentProcess:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if m := ADMIN.search(line):
                    self.port = int(m.group(1))
                if READY.search(line):
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(timeout) or self.proc.poll() is not None:
            # Reaped and its pipe closed here: left to the collector, the pipe's warning
            # would fail whichever test runs next.
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self._reader.join(5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            raise AssertionError(f"agent did not start: {''.join(self.log)}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def get(self, path: str) -> tuple[int, str]:
        assert self.port is not None
        return admin_get(self.port, path, self.netns)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by its full name with labels."""
        assert self.port is not None
        return scrape(self.port, self.netns)

    def served(self, command: str = "ADD", result: str = "ok", code: str = "") -> int:
        return served(self.metrics(), command, result, code)

    def fallbacks(self, reason: str) -> int:
        return int(self.metrics().get(f'cnibox_agent_fallbacks_total{{reason="{reason}"}}', 0))

    def workers(self) -> list[int]:
        """The agent's child processes now."""
        children = []
        for task in os.listdir(f"/proc/{self.pid}/task"):
            with open(f"/proc/{self.pid}/task/{task}/children") as f:
                children += [int(p) for p in f.read().split()]
        return children

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def admin_get(port: int, path: str, netns: str | None = None) -> tuple[int, str]:
    """GET http://127.0.0.1:`port``path` (from inside `netns` when given): status and body."""
    if netns is not None:
        from multicall.effects.ns import entered_netns

        with entered_netns(netns):
            return admin_get(port, path)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int, netns: str | None = None) -> dict[str, float]:
    """The /metrics samples of an agent whose admin server is on 127.0.0.1:`port`."""
    status, text = admin_get(port, "/metrics", netns)
    assert status == 200, text
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition by its full name with labels."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def served(
    metrics: dict[str, float], command: str = "ADD", result: str = "ok", code: str = ""
) -> int:
    """Requests the agent answered with a result (not handed back), by command and result."""
    labels = f'command="{command}",result="{result}",cni_code="{code}"'
    return int(metrics.get(f"cnibox_agent_requests_total{{{labels}}}", 0))


def answered(metrics: dict[str, float], command: str = "ADD") -> int:
    """Requests of `command` the agent answered with a result, whatever the result."""
    prefix = f'cnibox_agent_requests_total{{command="{command}",'
    return int(sum(v for k, v in metrics.items() if k.startswith(prefix)))


def fallbacks(metrics: dict[str, float]) -> int:
    """Requests the agent handed back or dropped, for any reason."""
    return int(sum(v for k, v in metrics.items() if k.startswith("cnibox_agent_fallbacks_total")))

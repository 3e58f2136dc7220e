"""Waiting for the node agent's own API identity: `--kubeconfig PATH` naming a file that
may not exist yet, or not be usable yet (docs/agent.md "The agent's API identity").

On Talos the agent is a system service started at boot, before install-cni (a DaemonSet
pod) has written its kubeconfig into /etc/cni/net.d, a tmpfs emptied by every reboot. So
a missing or unusable kubeconfig is not an error of the agent's start: ADDs never need it
(each reads the API with the kubeconfig its own config names), and the two parts that do
(the pod cache, the keeper) wait for it.

Rules of this module:
1. The retry schedule is the project's one back-off (core/backoff.py), with a lower cap:
   a retry reads a local file and asks the API nothing, so a thousand nodes retrying in
   step cost the API server nothing, and the cap bounds how long an agent goes without its
   pod cache after install-cni wrote the file (at most CAP plus its jitter, 2 * CAP).
2. What the agent waits for is logged once per kind of problem (the file is missing, or
   it cannot be used: the reason), not on every retry: a boot that waits a minute logs one
   line, and a file seen mid-write and then missing again logs each change.
3. Pure: the caller reads the file and passes the clock and the jitter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from multicall.core.backoff import Backoff

CAP = 5.0  # rule 1: seconds; doubling from backoff.INITIAL, 0.8 -> 1.6 -> 3.2 -> 5


class Problem(Enum):
    """Why the kubeconfig could not be loaded this time (rule 2)."""

    MISSING = "missing"  # no such file (yet)
    UNUSABLE = "unusable"  # present but not a readable, valid kubeconfig (yet)


def waiting_line(what: str, path: str, problem: Problem, detail: str) -> str:
    """The one log line of a wait (rule 2): what waits, for which file, and why."""
    if problem is Problem.MISSING:
        why = "does not exist yet (install-cni writes it)"
    else:
        why = f"cannot be used yet ({detail}); it may be mid-write"
    return (
        f"{what}: waiting for the agent's API identity: kubeconfig {path} {why}; "
        "retrying, ADDs are served meanwhile with each config's own kubeconfig"
    )


@dataclass(slots=True)
class IdentityWait:
    """One wait for the kubeconfig: the retry schedule and what was logged (rules 1-2)."""

    what: str  # who waits: "pod cache", "keeper"
    path: str
    backoff: Backoff = field(default_factory=lambda: Backoff(cap=CAP))
    logged: Problem | None = None  # the problem last logged
    attempts: int = 0

    def failed(self, now: float, draw: float, problem: Problem, detail: str) -> tuple[float, str]:
        """After an attempt that found `problem`: seconds to wait, and a line to log (""
        when this kind of problem was already logged)."""
        self.attempts += 1
        delay = self.backoff.failed(now, draw)
        line = ""
        if problem is not self.logged:
            self.logged = problem
            line = waiting_line(self.what, self.path, problem, detail)
        return delay, line

    def loaded(self) -> str:
        """After the attempt that loaded it: a line to log when it had to wait, else ""."""
        if not self.attempts:
            return ""
        return (
            f"{self.what}: kubeconfig {self.path} loaded after {self.attempts} failed "
            f"attempt{'s' if self.attempts != 1 else ''}; starting"
        )

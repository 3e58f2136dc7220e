"""What a node agent may do for a caller: never what the caller could not do itself
(docs/agent.md "Who may use the agent", issue 24).

The parent admits uid 0 only (agent/server.py). That is not authority: a uid-0 process
without capabilities, or root inside a user namespace, is uid 0 too, and the agent may hold
CAP_SYS_ADMIN (legacy/plain, the Talos service) to enter a pod netns it could not. So each
request's worker looks at the process that connected (effects/peer.py) and decides:

1. Seen (its /proc entry and user namespace readable): it must be in the agent's own user
   namespace and hold CAP_NET_ADMIN and CAP_SYS_ADMIN in its effective set, what the one-shot
   plugin in its place needs to enter a netns and program it. Otherwise the request is handed
   back: the caller's own one-shot run then succeeds or fails with the caller's authority.
2. Not seen (no pid in the agent's pid namespace, as in the DaemonSet without hostPID; /proc
   refusing ns/ without ptrace access): the worker serves only what the kernel checks against
   the caller itself, nf_tables on the netlink socket the caller made in the pod netns (the
   kernel requires CAP_NET_ADMIN of that socket's opener as well as of the sender), and never
   enters a netns for it (`Authority.may_enter`): such a request is handed back.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from multicall.core.proc_status import CAP_NET_ADMIN, CAP_SYS_ADMIN, missing_caps, parse_status

NEEDED = (CAP_NET_ADMIN, CAP_SYS_ADMIN)


@dataclass(frozen=True, slots=True)
class Authority:
    """What the worker may do with its own privileges for this caller."""

    may_enter: bool  # setns into the pod's or the caller's netns on its behalf (rule 1)


class Refused(Exception):
    """The caller may not have this agent act for it; `reason` is the FALLBACK reason (a
    fixed phrase: it is a metrics label)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def caller_authority(conn: socket.socket, own_userns: tuple[int, int]) -> Authority:
    """The authority of the process at the other end of `conn`; Refused when it is seen to
    lack what its request needs (rule 1) or is gone."""
    from multicall.effects.peer import PeerGone, peer

    try:
        seen = peer(conn)
    except PeerGone:
        raise Refused("caller gone") from None
    except OSError:
        return Authority(may_enter=False)
    return judge(seen.status, seen.userns, own_userns, seen.uid if not seen.pinned else None)


def judge(
    status: str | None,
    userns: tuple[int, int] | None,
    own_userns: tuple[int, int],
    peer_uid: int | None = None,
) -> Authority:
    """Rules 1 and 2 on what was read: the caller's /proc/PID/status text and user namespace
    (None: not seen). `peer_uid`: SO_PEERCRED's uid when the pidfd was not the kernel's
    SO_PEERPIDFD: the status must be of a process with that uid (a pid reused by a process
    of another uid is caught; one of the same uid is the race docs/agent.md describes)."""
    if userns is not None and userns != own_userns:
        raise Refused("caller in another user namespace")
    if status is None:
        return Authority(may_enter=False)
    try:
        parsed = parse_status(status)
    except ValueError:
        raise Refused("caller's status unreadable") from None
    if peer_uid is not None and parsed.euid != peer_uid:
        raise Refused("caller gone")
    missing = missing_caps(parsed.cap_eff, NEEDED)
    if missing:
        raise Refused(f"caller lacks {' and '.join(missing)}")
    return Authority(may_enter=userns is not None)

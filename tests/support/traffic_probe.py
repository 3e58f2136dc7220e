"""TCP probes for the mode-equivalence proofs, run inside test netns with `ip netns exec`.

(Listeners: tests/support/libcni/tcp_probe.py listen-dual.)

python3 traffic_probe.py connect JSON     JSON: [[host, port, uid, gid], ...] (uid null: as
                                          root); prints a JSON list of outcomes in order: the
                                          answer (the port of the listener the connection
                                          landed on) or "error: ..."

Connections of one (uid, gid) run in one forked child that drops to those ids first, so a
whole direction costs one process start.
"""

from __future__ import annotations

import json
import os
import socket
import sys

TIMEOUT = 2.0


def _one(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as s:
            return s.recv(64).decode().strip()
    except OSError as exc:
        return f"error: {type(exc).__name__}"


def connect(cases: list[list[object]]) -> None:
    "warm-up".encode("idna")  # socket calls import this codec lazily: do it while still root
    outcomes: list[str] = [""] * len(cases)
    groups: dict[tuple[object, object], list[int]] = {}
    for i, (_, _, uid, gid) in enumerate(cases):
        groups.setdefault((uid, gid), []).append(i)
    for (uid, gid), indices in groups.items():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            if uid is not None:
                os.setgroups([])
                os.setgid(int(str(gid)))
                os.setuid(int(str(uid)))
            found = [_one(str(cases[i][0]), int(str(cases[i][1]))) for i in indices]
            os.write(write, json.dumps(found).encode())
            os._exit(0)
        os.close(write)
        data = b""
        while chunk := os.read(read, 65536):
            data += chunk
        os.close(read)
        os.waitpid(pid, 0)
        for i, outcome in zip(indices, json.loads(data), strict=True):
            outcomes[i] = outcome
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    connect(json.loads(sys.argv[2]))

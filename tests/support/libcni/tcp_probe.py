"""TCP probes for the traffic proofs, run inside pod netns with `ip netns exec`.

python3 tcp_probe.py listen PORT...       answer each connection with "PORT\n" (the port of
                                          the listener that accepted it); prints "ready"
python3 tcp_probe.py listen-dual PORT...  the same on every IPv4 and IPv6 address
python3 tcp_probe.py connect HOST PORT [UID]
                                          connect (as UID if given), print the answer
"""

from __future__ import annotations

import os
import selectors
import socket
import sys


def listen(ports: list[int], *, dual: bool = False) -> None:
    sel = selectors.DefaultSelector()
    for port in ports:
        s = socket.socket(socket.AF_INET6 if dual else socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual:  # one socket for both families
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::" if dual else "0.0.0.0", port))
        s.listen(8)
        sel.register(s, selectors.EVENT_READ, port)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
            conn.sendall(f"{key.data}\n".encode())
            conn.close()


def connect(host: str, port: int, uid: int | None) -> None:
    "warm-up".encode("idna")  # socket calls import this codec lazily: do it while still root
    if uid is not None:
        os.setgid(uid)
        os.setuid(uid)
    with socket.create_connection((host, port), timeout=5) as s:
        print(s.recv(64).decode().strip(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] in ("listen", "listen-dual"):
        listen([int(p) for p in sys.argv[2:]], dual=sys.argv[1] == "listen-dual")
    else:
        connect(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)

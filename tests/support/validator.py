"""linkerd-network-validator's behaviour (behaviour doc §8), for pods in throwaway netns:
as uid 65534 it listens on --listen-addr, serving a random 63-character token plus a newline
to any client, connects to --connect-addr, reads the token back and compares. Success prints
"Validated" and exits 0; a mismatch, a connect error or --timeout exits 95.

With Linkerd's redirect in place the connection to --connect-addr is redirected to the
outbound proxy port (4140), which is this very listener; without it the connection goes
nowhere and the pod's init container fails, as upstream's does.

    validator.py LISTEN_PORT CONNECT_HOST CONNECT_PORT TIMEOUT_SECONDS
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - imported before dropping root: the venv is not readable
import os
import secrets
import socket
import string
import sys
import threading

UNSUCCESSFUL_EXIT_CODE = 95


def main() -> int:
    listen_port, host, port, timeout = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                        float(sys.argv[4]))  # fmt: skip
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    token = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(63))
    server = socket.create_server(("0.0.0.0", listen_port))

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(token.encode() + b"\n")

    threading.Thread(target=serve, daemon=True).start()
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            got = conn.makefile("rb").readline().decode().strip()
    except OSError as exc:
        print(f"validation failed: {exc}", file=sys.stderr)
        return UNSUCCESSFUL_EXIT_CODE
    if got != token:
        print("validation failed: token mismatch", file=sys.stderr)
        return UNSUCCESSFUL_EXIT_CODE
    print("Validated")
    return 0


if __name__ == "__main__":
    sys.exit(main())

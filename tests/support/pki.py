"""A CA and a server certificate for 127.0.0.1, made with the openssl CLI (a host tool: tests
that start a TLS API server need it)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_pki(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """A CA and a server certificate for 127.0.0.1 (and `extra_ips`: the arm64 VM reaches the
    server as QEMU's 10.0.2.2), made with the openssl CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt = directory / "srv.key", directory / "srv.csr", directory / "srv.crt"
    ext = directory / "srv.ext"
    sans = ",".join(["IP:127.0.0.1", *(f"IP:{ip}" for ip in extra_ips), "DNS:localhost"])
    ext.write_text(f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca_crt, "-days", "2",
             "-subj", "/CN=cnibox-test-ca")  # fmt: skip
    _openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=kube-apiserver")
    _openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
             "-out", crt, "-days", "2", "-extfile", ext)  # fmt: skip
    return Pki(ca_crt, crt, key)


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

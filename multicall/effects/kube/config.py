"""What a Kubernetes API client reads before it connects: the kubeconfig, the bearer token,
the CA it trusts (as an ssl context), the API deadline from the environment, and the
endpoint of the server URL; with client-go's wording of each failure.

Files (kubeconfig, token, CA) are read bounded, non-blocking and regular files only
(effects/inputs.py), which a node agent's worker points at its caller
(agent/caller_files.py). What goes on the wire is checked first: the server URL and the token
(core/kube/kubeconfig.py `parse_server`, `check_token`) cannot inject headers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from multicall.core.kube.kubeconfig import (
    LOAD_ERROR,
    TOKEN_FIELD,
    KubeConfig,
    check_token,
    decode_yaml_text,
    parse_kubeconfig,
    parse_server,
    resolve_paths,
)
from multicall.core.limits import (
    CA_FILE,
    KUBE_TIMEOUT_DEFAULT,
    KUBE_TIMEOUT_MAX,
    KUBECONFIG,
    TOKEN_FILE,
)
from multicall.effects.caller import OWN_FILES, Files
from multicall.effects.http import Endpoint, new_client_context
from multicall.errors import CNI_INVALID_ENV, CniError, ConfigError, KubeError, UnreadableInput

if TYPE_CHECKING:
    import ssl

DEFAULT_TIMEOUT = KUBE_TIMEOUT_DEFAULT
TIMEOUT_ENV = "CNIBOX_KUBE_TIMEOUT"


def timeout_from_env(env: Mapping[str, str]) -> float:
    """`CNIBOX_KUBE_TIMEOUT`: the seconds all API requests of one invocation may take
    together; the default when unset or empty, clamped to KUBE_TIMEOUT_MAX (`inf` too);
    CniError (invalid environment) for anything that is not a positive number."""
    import math

    raw = env.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value <= 0:
        raise CniError(
            CNI_INVALID_ENV,
            f"{TIMEOUT_ENV}={raw[:40]!r} is not a number of seconds above 0 "
            f"(the default is {DEFAULT_TIMEOUT:g}, at most {KUBE_TIMEOUT_MAX:g} is used)",
        )
    return min(value, KUBE_TIMEOUT_MAX)


def read_kubeconfig(path: str, *, files: Files = OWN_FILES) -> KubeConfig:
    """The kubeconfig at `path` (client-go's ExplicitPath); KubeError when it cannot be used."""
    if not path:
        raise KubeError(
            "invalid configuration: no configuration has been provided, try setting "
            "KUBERNETES_MASTER environment variable"
        )
    # client-go stats an explicit kubeconfig path before opening it.
    data = read_client_file(
        path, limit=KUBECONFIG, what="kubeconfig", missing_verb="stat", files=files
    )
    try:
        return resolve_paths(parse_kubeconfig(decode_yaml_text(data)), path)
    except ConfigError as exc:
        message = exc.message
        if message.startswith(LOAD_ERROR):  # client-go's loader names the file
            message = f'error loading config file "{path}": {message[len(LOAD_ERROR) :]}'
        raise KubeError(message, path=path) from None


def read_text_file(
    path: str, *, limit: int, what: str, missing_verb: str = "open", files: Files = OWN_FILES
) -> str:
    """A UTF-8 file the client reads (a token, a CA), bounded and checked to be a regular
    file (effects/inputs.py); KubeError with client-go's wording of open failures."""
    data = read_client_file(path, limit=limit, what=what, missing_verb=missing_verb, files=files)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KubeError(
            f"{what} {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            path=path,
        ) from None


def read_client_file(
    path: str, *, limit: int, what: str, missing_verb: str = "open", files: Files = OWN_FILES
) -> bytes:
    """A file the client reads, bounded and a regular file only (effects/inputs.py); KubeError
    with client-go's wording of open failures."""
    import errno
    import os

    from multicall.effects.inputs import read_file

    try:
        return read_file(path, limit=limit, what=what, files=files)
    except UnreadableInput as exc:
        if exc.errno == errno.ENOENT:
            raise KubeError(
                f"{missing_verb} {path}: no such file or directory", path=path
            ) from None
        if exc.errno is not None:
            reason = os.strerror(exc.errno).lower()
            raise KubeError(f"open {path}: {reason}", path=path) from None
        raise KubeError(exc.message, path=path) from None


def endpoint(server: str, server_name: str = "") -> Endpoint:
    """The server URL's endpoint, TLS naming `server_name` when given (`tls-server-name`);
    KubeError when it is not one client-go would use."""
    try:
        url = parse_server(server)
    except ConfigError as exc:
        raise KubeError(exc.message) from None
    return Endpoint(url.scheme, url.host, url.port, url.prefix, server_name)


def read_token(config: KubeConfig, files: Files = OWN_FILES) -> str:
    """The bearer token: from tokenFile (trimmed, as client-go does), else inline; refused
    when it could not be sent as one header value (core/kube/kubeconfig.check_token).

    With both set, client-go sends the file's token and falls back to the inline one when
    the file cannot be read or is empty (transport's cached file token source)."""
    token, field = config.token.strip(), TOKEN_FIELD
    if config.token_file:
        try:
            from_file = read_text_file(
                config.token_file, limit=TOKEN_FILE, what="token file", files=files
            ).strip()
        except KubeError:
            if not config.token:
                raise
            from_file = ""
        if from_file or not config.token:
            token, field = from_file, f"the token file {config.token_file} (users[].user.tokenFile)"
    try:
        return check_token(token, field)
    except ConfigError as exc:
        raise KubeError(exc.message) from None


def tls_context(
    config: KubeConfig,
    new_context: Callable[[], ssl.SSLContext] = new_client_context,
    files: Files = OWN_FILES,
) -> ssl.SSLContext:
    """ssl.create_default_context()'s client context for `config`'s trust settings, on the
    context `new_context` gives (a node agent's worker: one made ahead of time,
    effects/kube/warm.py)."""
    import ssl

    if config.insecure_skip_tls_verify and (config.ca_data or config.ca_file):
        # client-go's transport.TLSConfigFor refuses the pair rather than pick one.
        raise KubeError("specifying a root certificates file with the insecure flag is not allowed")
    if config.insecure_skip_tls_verify:
        ctx = new_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if config.ca_data:
        pem = config.ca_data.decode("ascii", "replace")
    elif config.ca_file:
        # Read as every input is (bounded, a regular file, no blocking open; in an agent's
        # worker opened by the caller, `files`): OpenSSL's own fopen would wait forever on a
        # FIFO and read /dev/zero without end.
        pem = read_text_file(
            config.ca_file, limit=CA_FILE, what="certificate-authority file", files=files
        )
    else:
        ctx = new_context()
        ctx.load_default_certs()
        return ctx
    ctx = new_context()
    try:
        ctx.load_verify_locations(cadata=pem)
    except (ssl.SSLError, ValueError):
        # Go's x509.CertPool.AppendCertsFromPEM wording, not OpenSSL's error codes.
        raise KubeError(
            "unable to load root certificates: unable to parse bytes as PEM block"
        ) from None
    return ctx

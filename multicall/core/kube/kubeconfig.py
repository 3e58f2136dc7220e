"""The kubeconfig the installer writes (`ZZZ-linkerd-cni-kubeconfig`), read as client-go would
with the current context forced to `linkerd-cni-context` (docs/upstream-behaviour.md §3 step 2).

Rules of this module: pure text in, a frozen `KubeConfig` out; every failure is a
`ConfigError` naming what is missing. The installer's own layout is read by a strict pattern;
anything else goes through PyYAML, imported only then (it costs ~25 ms of every meshed ADD).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass

from multicall.errors import ConfigError

CONTEXT = "linkerd-cni-context"


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """What a request to the API needs from a kubeconfig."""

    server: str
    token: str = ""
    token_file: str = ""
    ca_data: bytes = b""  # PEM bundle from certificate-authority-data
    ca_file: str = ""
    insecure_skip_tls_verify: bool = False
    tls_server_name: str = ""  # TLS's SNI and the name verified, instead of the server's host


# What install-cni writes (core/installer/config.py KUBECONFIG_TEMPLATE), with values restricted to
# characters that YAML reads as the same plain scalars.
_INSTALLER_FORM = re.compile(
    r"(?:#[^\n]*\n)*"
    r"apiVersion: v1\nkind: Config\nclusters:\n"
    r"- name: (?P<cluster>[A-Za-z0-9._-]+)\n  cluster:\n"
    r"    server: (?P<server>https?://[A-Za-z0-9.:\[\]_/-]+)\n"
    r"    certificate-authority-data: (?P<ca>[A-Za-z0-9+/]+={0,2})\n"
    r"users:\n- name: (?P<user>[A-Za-z0-9._-]+)\n  user:\n    token: (?P<token>[A-Za-z0-9._-]+)\n"
    r"contexts:\n- name: (?P<context>[A-Za-z0-9._-]+)\n  context:\n"
    r"    cluster: (?P=cluster)\n    user: (?P=user)\n"
    r"current-context: (?P=context)\n?"
)


def _installer_form(text: str, context: str) -> KubeConfig | None:
    match = _INSTALLER_FORM.fullmatch(text)
    if match is None or match["context"] != context:
        return None
    try:
        ca = base64.b64decode(match["ca"], validate=True)
    except (binascii.Error, ValueError):
        return None
    return KubeConfig(server=match["server"], token=match["token"], ca_data=ca)


LOAD_ERROR = "error loading config: "  # client-go's is `error loading config file "PATH": `


def _load(text: str) -> object:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader, chosen above
    except yaml.YAMLError as exc:
        raise ConfigError(f"{LOAD_ERROR}{exc}") from None
    if isinstance(doc, Mapping):
        _refuse_duplicates(doc)
    return doc


# client-go converts each named list into a map and refuses a name seen twice, in this
# order (api/v1 conversion.go). Its message ends with the whole list in Go syntax (`%#v`),
# tokens included; cnibox stops after the name so no credential reaches a log.
_NAMED_LISTS = (
    ("clusters", "*[]NamedCluster into *map[string]*api.Cluster"),
    ("users", "*[]NamedAuthInfo into *map[string]*api.AuthInfo"),
    ("contexts", "*[]NamedContext into *map[string]*api.Context"),
    ("extensions", "*[]NamedExtension into *map[string]runtime.Object"),
)


def _refuse_duplicates(doc: Mapping[str, object]) -> None:
    for section, conversion in _NAMED_LISTS:
        entries = doc.get(section)
        if not isinstance(entries, list):
            continue
        seen: set[str] = set()
        for entry in entries:
            name = entry.get("name") if isinstance(entry, Mapping) else None
            key = name if isinstance(name, str) else ""
            if key in seen:
                raise ConfigError(
                    f"{LOAD_ERROR}error converting {conversion}: duplicate name "
                    f'"{key[:200]}" in list'
                )
            seen.add(key)


def decode_yaml_text(data: bytes) -> str:
    """A kubeconfig's bytes as text, refused as the YAML reader client-go uses (go-yaml's
    reader.go, via sigs.k8s.io/yaml) refuses them: invalid UTF-8 and control characters are
    `yaml: ...` errors (client-go does not replace them with U+FFFD). A UTF-8 BOM is
    skipped; UTF-16 (which go-yaml decodes after its BOM) is refused as invalid UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _refuse_control_characters(data[: exc.start].decode("utf-8"))  # read first, as go-yaml
        problem = _utf8_problem(data[exc.start : exc.start + 4])
        raise ConfigError(f"{LOAD_ERROR}yaml: {problem}") from None
    _refuse_control_characters(text)
    return text.removeprefix("\ufeff")


def _refuse_control_characters(text: str) -> None:
    if _NOT_PRINTABLE.search(text) is not None:
        raise ConfigError(f"{LOAD_ERROR}yaml: control characters are not allowed")


# go-yaml's printable set: TAB, LF, CR, 0x20-0x7E, 0x85, 0xA0-0xD7FF, 0xE000-0xFFFD and above
# 0xFFFF (UTF-8 decoding already refused surrogates).
_NOT_PRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ufffe\uffff]")


_UTF8_LEADS = ((0xE0, 0xC0, 2), (0xF0, 0xE0, 3), (0xF8, 0xF0, 4))  # mask, value, width


def _utf8_problem(seq: bytes) -> str:
    """go-yaml's words for the invalid UTF-8 sequence that starts `seq`."""
    lead = seq[0]
    width = next((w for mask, top, w in _UTF8_LEADS if lead & mask == top), 0)
    if width == 0:
        return "invalid leading UTF-8 octet"
    if len(seq) < width:  # the file ends inside the sequence
        return "incomplete UTF-8 octet sequence"
    if any(b >> 6 != 2 for b in seq[1:width]):
        return "invalid trailing UTF-8 octet"
    value = lead & (0x1F, 0x0F, 0x07)[width - 2]
    for b in seq[1:width]:
        value = value << 6 | (b & 0x3F)
    if value < (0x80, 0x800, 0x10000)[width - 2]:
        return "invalid length of a UTF-8 sequence"
    return "invalid Unicode character"


def _named(doc: Mapping[str, object], section: str, name: str, inner: str) -> Mapping[str, object]:
    entries = doc.get(section) or []
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                body = entry.get(inner) or {}
                return body if isinstance(body, Mapping) else {}
    return {}


def _text(body: Mapping[str, object], key: str) -> str:
    value = body.get(key)
    return value if isinstance(value, str) else ""


def parse_kubeconfig(
    text: str, context: str | None = CONTEXT, *, cluster_name: str = "", user_name: str = ""
) -> KubeConfig:
    """The cluster and user of `context` (None: the file's current-context; a non-empty
    `cluster_name`/`user_name` overrides the context's, as kubectl's --cluster/--user do),
    or ConfigError with client-go's complaint."""
    if context is not None and not cluster_name and not user_name:
        fast = _installer_form(text, context)
        if fast is not None:
            return fast
    doc = _load(text)
    if not isinstance(doc, Mapping):
        raise ConfigError("invalid configuration: no configuration has been provided")
    if context is None:
        context = _text(doc, "current-context")
    ctx = _named(doc, "contexts", context, "context")
    if not ctx and not (cluster_name and user_name):
        raise ConfigError(
            f"invalid configuration: [context was not found for specified context: {context}, "
            "cluster has no server defined]"
        )
    cluster = _named(doc, "clusters", cluster_name or _text(ctx, "cluster"), "cluster")
    user = _named(doc, "users", user_name or _text(ctx, "user"), "user")
    server = _text(cluster, "server")
    if not server:
        raise ConfigError("invalid configuration: cluster has no server defined")
    return KubeConfig(
        server=server,
        token=_text(user, "token"),
        token_file=_text(user, "tokenFile"),
        ca_data=_ca(cluster),
        ca_file=_text(cluster, "certificate-authority"),
        insecure_skip_tls_verify=cluster.get("insecure-skip-tls-verify") is True,
        tls_server_name=_text(cluster, "tls-server-name"),
    )


def _ca(cluster: Mapping[str, object]) -> bytes:
    data = _text(cluster, "certificate-authority-data")
    if not data:
        return b""
    try:
        # encoding/json decodes []byte with base64.StdEncoding, which skips CR and LF: a
        # literal block wrapped at 64 columns is valid.
        return base64.b64decode(data.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(
            "invalid configuration: certificate-authority-data is not valid base64"
        ) from None


def resolve_paths(config: KubeConfig, kubeconfig_path: str) -> KubeConfig:
    """client-go's ResolveLocalPaths: a relative `tokenFile` or `certificate-authority` is
    relative to the kubeconfig's directory, not to the working directory."""
    import posixpath
    from dataclasses import replace

    base = posixpath.dirname(kubeconfig_path)

    def resolved(path: str) -> str:
        return posixpath.join(base, path) if path and not posixpath.isabs(path) else path

    return replace(config, token_file=resolved(config.token_file), ca_file=resolved(config.ca_file))


# ----------------------------------------------------------------------------- values sent


@dataclass(frozen=True, slots=True)
class ServerUrl:
    """A cluster's `server` as the client dials it and writes its request lines."""

    scheme: str
    host: str  # without IPv6 brackets
    port: int
    prefix: str  # the URL's path, percent-encoded as Go's URL.EscapedPath, no trailing '/'


SERVER_FIELD = "clusters[].cluster.server"
TOKEN_FIELD = "users[].user.token"  # noqa: S105 - a field name, not a secret
# What Go's url.URL.EscapedPath leaves unescaped in a path; all else is %XX.
_PATH_SAFE = "$&+,/:;=@-_.~"
# What Go's validEncoded accepts as an already-encoded path (kept as written).
_ENCODED_PATH = re.compile(r"(?:[A-Za-z0-9\-_.~!$&'()*+,;=:@\[\]/]|%[0-9A-Fa-f]{2})*")
_BAD_HOST = re.compile(r"[\s\"<>\\^`{|}%/?#@]")


def _url_error(server: str, reason: str) -> ConfigError:
    return ConfigError(
        f"invalid configuration: {SERVER_FIELD} {server[:200]!r} is not a usable URL: {reason}"
    )


def parse_server(server: str) -> ServerUrl:
    """client-go's reading of `server` (Go's url.Parse), refusing what would break the
    request line or the Host header: control characters (CR/LF), bad escapes, bad ports."""
    from urllib.parse import quote, unquote, urlsplit

    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in server):
        raise _url_error(server, "net/url: invalid control character in URL")
    try:
        parts = urlsplit(server)
        port = parts.port
    except ValueError as exc:
        raise _url_error(server, str(exc)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"invalid configuration: host must be a URL, got {server[:200]!r}")
    host = parts.hostname
    if _BAD_HOST.search(host) or (":" in host and "[" not in parts.netloc):
        raise _url_error(server, f"invalid character in host name {host!r}")
    if port == 0:
        raise _url_error(server, "port 0")
    path = parts.path
    if not _ENCODED_PATH.fullmatch(path):
        if re.search(r"%(?![0-9A-Fa-f]{2})", path):
            raise _url_error(server, "invalid URL escape in the path")
        path = quote(unquote(path), safe=_PATH_SAFE)
    default = 443 if parts.scheme == "https" else 80
    return ServerUrl(parts.scheme, host, port or default, path.rstrip("/"))


def check_token(token: str, field: str = TOKEN_FIELD) -> str:
    """A bearer token fit for an HTTP header: visible ASCII only. A CR or LF would end the
    header and start another (request smuggling); Go's net/http refuses them too."""
    bad = next((c for c in token if not (0x21 <= ord(c) <= 0x7E)), None)
    if bad is not None:
        raise ConfigError(
            f"invalid configuration: {field} contains {_char_name(bad)}; "
            "a bearer token is printable ASCII without spaces"
        )
    return token


def _char_name(c: str) -> str:
    names = {"\r": "a carriage return (CR)", "\n": "a line feed (LF)", " ": "a space"}
    return names.get(c, f"the character U+{ord(c):04X}")

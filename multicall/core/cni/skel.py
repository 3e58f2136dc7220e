"""What containernetworking/cni v1.3.0's `skel` checks before a plugin's handler runs: the
CNI_* environment, the network config's name, the command's version gate, CNI_ARGS, and the
VERSION reply and error JSON it prints.

Rules of this module:
1. Validation happens in skel's order with skel's codes and texts
   (docs/upstream-behaviour.md §1.1): env variables first (bad container ID / interface name
   as soon as they are seen, then the list of missing ones), then the network config, then
   the command's version gate.
2. Errors are 4-space indented without a trailing newline (types.Error.Print).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from multicall.core.go.encoding_json.decode import STRING, Struct, decode
from multicall.core.go.encoding_json.encode import marshal
from multicall.core.go.encoding_json.scanner import GoJsonError
from multicall.core.go.strconv import NumError, go_atoi, go_quote, go_quote_list
from multicall.core.limits import NETWORK_CONFIG, describe_size
from multicall.errors import (
    CNI_DECODING_FAILURE,
    CNI_INCOMPATIBLE_VERSION,
    CNI_INTERNAL,
    CNI_INVALID_ENV,
    CNI_INVALID_NETWORK_CONFIG,
    CNI_IO_FAILURE,
    CNI_UNKNOWN_CONTAINER,
    CniError,
)

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
IMPLEMENTED_VERSION = "1.1.0"

VERSION_REPLY = (
    marshal({"cniVersion": IMPLEMENTED_VERSION, "supportedVersions": SUPPORTED_VERSIONS}) + "\n"
).encode()

_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")

# (variable, commands that require it, validator applied when it is set and required)
_ENV_VARS = (
    ("CNI_COMMAND", ("ADD", "CHECK", "DEL", "GC", "STATUS"), None),
    ("CNI_CONTAINERID", ("ADD", "CHECK", "DEL"), "container"),
    ("CNI_NETNS", ("ADD", "CHECK"), None),
    ("CNI_IFNAME", ("ADD", "CHECK", "DEL"), "ifname"),
    ("CNI_ARGS", (), None),
    ("CNI_PATH", ("ADD", "CHECK", "DEL", "GC", "STATUS"), None),
    ("CNI_NETNS_OVERRIDE", (), None),
)


@dataclass(frozen=True, slots=True)
class CniEnv:
    """The CNI_* environment of one invocation."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: str = ""
    path: str = ""
    netns_override: str = ""

    @property
    def override_netns_check(self) -> bool:
        return self.netns_override.upper() == "TRUE" or self.netns_override == "1"


def read_env(env: Mapping[str, str]) -> CniEnv:
    """skel's getCmdArgsFromEnv (without reading stdin)."""
    command = env.get("CNI_COMMAND", "")
    missing = []
    values: dict[str, str] = {}
    for name, required_for, validator in _ENV_VARS:
        value = env.get(name, "")
        values[name] = value
        required = command in required_for
        if value == "":
            if required or name == "CNI_COMMAND":
                missing.append(name)
        elif required and validator == "container":
            validate_container_id(value)
        elif required and validator == "ifname":
            validate_ifname(value)
    if missing:
        raise CniError(CNI_INVALID_ENV, f"required env variables [{','.join(missing)}] missing")
    return CniEnv(
        command=command,
        container_id=values["CNI_CONTAINERID"],
        netns=values["CNI_NETNS"],
        ifname=values["CNI_IFNAME"],
        args=values["CNI_ARGS"],
        path=values["CNI_PATH"],
        netns_override=values["CNI_NETNS_OVERRIDE"],
    )


def validate_container_id(value: str) -> None:
    if value == "":
        raise CniError(CNI_UNKNOWN_CONTAINER, "missing containerID")
    if not _NAME_RE.fullmatch(value):
        raise CniError(CNI_INVALID_ENV, "invalid characters in containerID", value)


def validate_ifname(value: str) -> None:
    if value == "":
        raise CniError(CNI_INVALID_ENV, "interface name is empty")
    if len(value.encode("utf-8", "surrogateescape")) > 15:
        raise CniError(
            CNI_INVALID_ENV,
            "interface name is too long",
            "interface name should be less than 16 characters",
        )
    if value in (".", ".."):
        raise CniError(CNI_INVALID_ENV, "interface name is . or ..")
    if any(ch in "/:" or ch.isspace() or ch in "\x85\xa0" for ch in value):
        raise CniError(CNI_INVALID_ENV, "interface name contains / or : or whitespace characters")


def check_config_size(stdin: bytes) -> None:
    """The network config is read with a bound (core/limits.py), reported as skel reports a
    failed read of stdin."""
    if len(stdin) > NETWORK_CONFIG:
        raise CniError(
            CNI_IO_FAILURE,
            f"error reading from stdin: the network config is larger than "
            f"{describe_size(NETWORK_CONFIG)}, the limit for it",
        )


_NAME_ONLY = Struct("", 'struct { Name string "json:\\"name\\"" }', (("name", STRING),))
_VERSION_ONLY = Struct(
    "", 'struct { CNIVersion string "json:\\"cniVersion\\"" }', (("cniVersion", STRING),)
)


def validate_config(stdin: bytes) -> None:
    """skel's validateConfig: a JSON object with a valid `name`."""
    try:
        conf = decode(stdin, _NAME_ONLY)
    except GoJsonError as exc:
        raise CniError(CNI_DECODING_FAILURE, f"error unmarshall network config: {exc}") from None
    name = conf.get("name") or ""
    assert isinstance(name, str)
    if name == "":
        raise CniError(CNI_INVALID_NETWORK_CONFIG, "missing network name")
    if not _NAME_RE.fullmatch(name):
        raise CniError(CNI_INVALID_NETWORK_CONFIG, "invalid characters found in network name", name)


def decode_version(stdin: bytes) -> str:
    """create.DecodeVersion: the config's cniVersion, "0.1.0" when absent."""
    try:
        conf = decode(stdin, _VERSION_ONLY)
    except GoJsonError as exc:
        raise CniError(
            CNI_DECODING_FAILURE, f"decoding version from network config: {exc}"
        ) from None
    version = conf.get("cniVersion") or ""
    assert isinstance(version, str)
    return version or "0.1.0"


def parse_version(version: str) -> tuple[int, int, int]:
    """version.ParseVersion, with Go's error texts (raised as CNI decode errors)."""
    if version == "":
        return (0, 1, 0)
    parts = version.split(".")
    if len(parts) >= 4:
        raise CniError(CNI_DECODING_FAILURE, f"invalid version {go_quote(version)}: too many parts")
    numbers = [0, 0, 0]
    for i, (label, part) in enumerate(zip(("major", "minor", "micro"), parts, strict=False)):
        try:
            numbers[i] = go_atoi(part)
        except NumError as exc:
            raise CniError(
                CNI_DECODING_FAILURE,
                f"failed to convert {label} version part {go_quote(part)}: {exc}",
            ) from None
    return (numbers[0], numbers[1], numbers[2])


def at_least(version: str, floor: str) -> bool:
    return parse_version(version) >= parse_version(floor)


def check_version(command: str, config_version: str) -> None:
    """The version gate skel applies before a command's handler runs."""
    floors = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}
    if command in floors:
        if not at_least(config_version, floors[command]):
            raise CniError(CNI_INCOMPATIBLE_VERSION, f"config version does not allow {command}")
        if not any(at_least(v, config_version) for v in SUPPORTED_VERSIONS):
            raise CniError(CNI_INCOMPATIBLE_VERSION, f"plugin version does not allow {command}")
    if config_version not in SUPPORTED_VERSIONS:
        raise CniError(
            CNI_INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            f"config is {go_quote(config_version)}, plugin supports "
            f"{go_quote_list(list(SUPPORTED_VERSIONS))}",
        )


def render_error(code: int, msg: str, details: str = "") -> bytes:
    """types.Error.Print: `{"code", "msg", "details"?}`, 4-space indent, no newline."""
    body: dict[str, object] = {"code": code, "msg": msg}
    if details:
        body["details"] = details
    return marshal(body, indent=4).encode()


# --- CNI_ARGS ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """The pod named by CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME)."""

    namespace: str
    name: str

    @property
    def complete(self) -> bool:
        return bool(self.namespace and self.name)


_ARG_FIELDS = ("IgnoreUnknown", "K8sPodName", "K8sPodNamespace", "CommonArgs")


def parse_cni_args(raw: str) -> PodIdentity:
    """The plugin's K8S_* renames, then types.LoadArgs into its K8sArgs struct."""
    raw = raw.replace("K8S_POD_NAMESPACE", "K8sPodNamespace", 1)
    raw = raw.replace("K8S_POD_NAME", "K8sPodName", 1)
    values: dict[str, str] = {}
    if raw == "":
        return PodIdentity("", "")
    unknown = []
    ignore_unknown = False
    for pair in raw.split(";"):
        kv = pair.split("=")
        if len(kv) != 2:
            raise CniError(CNI_INTERNAL, f"ARGS: invalid pair {go_quote(pair)}")
        key, value = kv
        if key not in _ARG_FIELDS:
            unknown.append(pair)
            continue
        if key == "CommonArgs":
            raise CniError(
                CNI_INTERNAL,
                "ARGS: cannot unmarshal into field 'CommonArgs' - type '*types.CommonArgs' "
                "does not implement encoding.TextUnmarshaler",
            )
        if key == "IgnoreUnknown":
            ignore_unknown = _unmarshal_bool(pair, value)
        else:
            values[key] = value
    if unknown and not ignore_unknown:
        raise CniError(CNI_INTERNAL, f"ARGS: unknown args {go_quote_list(unknown)}")
    return PodIdentity(values.get("K8sPodNamespace", ""), values.get("K8sPodName", ""))


def pod_uid(raw: str) -> str:
    """K8S_POD_UID of CNI_ARGS (containerd and CRI-O pass it; upstream's K8sArgs ignores it
    under IgnoreUnknown): which pod object the runtime is creating the sandbox for. Read
    after `parse_cni_args` accepted `raw`; "" when absent."""
    for pair in raw.split(";"):
        key, _, value = pair.partition("=")
        if key == "K8S_POD_UID":
            return value
    return ""


def log_fields(env: Mapping[str, str]) -> dict[str, str]:
    """The pod identity fields of upstream's log entries (ContainerID, Namespace, Pod),
    read leniently from the raw environment so that even a failure to parse CNI_ARGS or
    the config is logged with them; values are capped (they reach a log line as given)."""
    pairs = dict(pair.partition("=")[::2] for pair in env.get("CNI_ARGS", "").split(";"))
    fields = {
        "ContainerID": env.get("CNI_CONTAINERID", ""),
        "Namespace": pairs.get("K8S_POD_NAMESPACE", ""),
        "Pod": pairs.get("K8S_POD_NAME", ""),
    }
    return {key: value[:256] for key, value in fields.items()}


def _unmarshal_bool(pair: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true"):
        return True
    if lowered in ("0", "false"):
        return False
    raise CniError(
        CNI_INTERNAL,
        f"ARGS: error parsing value of pair {go_quote(pair)}: "
        f"boolean unmarshal error: invalid input {lowered}",
    )

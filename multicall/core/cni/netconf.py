"""The plugin's network configuration (docs/upstream-behaviour.md §2), decoded as upstream's
Go decodes it.

Rules of this module:
1. Keys match case-insensitively, duplicates are decoded in order, unknown keys are ignored,
   absent keys keep Go's zero values (0, "", false, empty lists) — not the chart's defaults.
2. A type mismatch fails with upstream's text: `linkerd-cni: failed to parse network
   configuration: json: cannot unmarshal ...` (CNI code 999, as upstream returns it).
3. Nothing here validates ports, subnets or the iptables mode: upstream does that only when it
   builds rules for a meshed pod, so `mode_of` is called at that point, not at parse time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core.go.encoding_json.decode import (
    ANYMAP,
    BOOL,
    BOOLMAP,
    INT,
    STRING,
    Slice,
    Struct,
    decode,
    field_int,
    field_ints,
    field_str,
    field_strs,
    field_struct,
)
from multicall.core.go.encoding_json.scanner import GoJsonError
from multicall.core.limits import CONFIG_JSON_VALUES, too_many_json_values
from multicall.errors import CNI_INTERNAL, CniError

if TYPE_CHECKING:
    # Imported where used: ADDs of pods that get no rules never need the firewall model.
    from multicall.core.firewall.model import Mode, ProxyInitOptions

_STRINGS = Slice(STRING, "[]string")
_PROXY_INIT = Struct(
    "ProxyInit",
    "main.ProxyInit",
    (
        ("incoming-proxy-port", INT),
        ("outgoing-proxy-port", INT),
        ("proxy-uid", INT),
        ("proxy-gid", INT),
        ("ports-to-redirect", Slice(INT, "[]int")),
        ("inbound-ports-to-ignore", _STRINGS),
        ("outbound-ports-to-ignore", _STRINGS),
        ("subnets-to-ignore", _STRINGS),
        ("simulate", BOOL),
        ("use-wait-flag", BOOL),
        ("iptables-mode", STRING),
        ("ipv6", BOOL),
    ),
)
_KUBERNETES = Struct(
    "Kubernetes", "main.Kubernetes", (("k8s_api_root", STRING), ("kubeconfig", STRING))
)
_DNS = Struct(
    "DNS",
    "types.DNS",
    (("nameservers", _STRINGS), ("domain", STRING), ("search", _STRINGS), ("options", _STRINGS)),
)
_ATTACHMENT = Struct(
    "GCAttachment", "types.GCAttachment", (("containerID", STRING), ("ifname", STRING))
)
PLUGIN_CONF = Struct(
    "PluginConf",
    "main.PluginConf",
    (
        ("cniVersion", STRING),
        ("name", STRING),
        ("type", STRING),
        ("capabilities", BOOLMAP),
        ("ipam", Struct("IPAM", "types.IPAM", (("type", STRING),))),
        ("dns", _DNS),
        ("cni.dev/valid-attachments", Slice(_ATTACHMENT, "[]types.GCAttachment")),
        ("prevResult", ANYMAP),
        ("log_level", STRING),
        ("log_file", STRING),  # cnibox's: the plugin's log lines also go to this file
        ("linkerd", _PROXY_INIT),
        ("kubernetes", _KUBERNETES),
    ),
)

# upstream's text, with cnibox's own native mode added (docs/firewall.md)
MODE_ERROR = '--iptables-mode valid values are only "legacy", "nft", "plain" and "nftables"'


@dataclass(frozen=True, slots=True)
class NetConf:
    """Everything the plugin reads from its stdin, with upstream's absent-key values."""

    cni_version: str = ""
    name: str = ""
    type: str = ""
    log_level: str = ""
    log_file: str = ""
    prev_result: Mapping[str, object] | None = None
    kubeconfig: str = ""
    k8s_api_root: str = ""
    incoming_proxy_port: int = 0
    outgoing_proxy_port: int = 0
    proxy_uid: int = 0
    proxy_gid: int = 0
    ports_to_redirect: tuple[int, ...] = ()
    inbound_ports_to_ignore: tuple[str, ...] = ()
    outbound_ports_to_ignore: tuple[str, ...] = ()
    subnets_to_ignore: tuple[str, ...] = ()
    simulate: bool = False
    use_wait_flag: bool = False
    iptables_mode: str = ""
    ipv6: bool = False


def parse_netconf(data: bytes) -> NetConf:
    """Decode the plugin's stdin; CniError 999 with upstream's message on failure."""
    refused = too_many_json_values(data, CONFIG_JSON_VALUES)
    if refused:
        raise CniError(
            CNI_INTERNAL, f"linkerd-cni: failed to parse network configuration: {refused}"
        )
    try:
        fields = decode(data, PLUGIN_CONF)
    except GoJsonError as exc:
        raise CniError(
            CNI_INTERNAL, f"linkerd-cni: failed to parse network configuration: {exc}"
        ) from None
    linkerd = field_struct(fields, "linkerd")
    kube = field_struct(fields, "kubernetes")
    prev = fields.get("prevResult")
    return NetConf(
        cni_version=field_str(fields, "cniVersion"),
        name=field_str(fields, "name"),
        type=field_str(fields, "type"),
        log_level=field_str(fields, "log_level"),
        log_file=field_str(fields, "log_file"),
        prev_result=prev if isinstance(prev, dict) else None,
        kubeconfig=field_str(kube, "kubeconfig"),
        k8s_api_root=field_str(kube, "k8s_api_root"),
        incoming_proxy_port=field_int(linkerd, "incoming-proxy-port"),
        outgoing_proxy_port=field_int(linkerd, "outgoing-proxy-port"),
        proxy_uid=field_int(linkerd, "proxy-uid"),
        proxy_gid=field_int(linkerd, "proxy-gid"),
        ports_to_redirect=field_ints(linkerd, "ports-to-redirect"),
        inbound_ports_to_ignore=field_strs(linkerd, "inbound-ports-to-ignore"),
        outbound_ports_to_ignore=field_strs(linkerd, "outbound-ports-to-ignore"),
        subnets_to_ignore=field_strs(linkerd, "subnets-to-ignore"),
        simulate=linkerd.get("simulate") is True,
        use_wait_flag=linkerd.get("use-wait-flag") is True,
        iptables_mode=field_str(linkerd, "iptables-mode"),
        ipv6=linkerd.get("ipv6") is True,
    )


def log_level(netconf: NetConf) -> str:
    """upstream's configureLoggingLevel: "debug", "info", anything else is "warn"."""
    level = netconf.log_level.lower()
    return level if level in ("debug", "info") else "warn"


def base_options(netconf: NetConf) -> ProxyInitOptions:
    """The firewall options the config alone asks for (before any annotation override)."""
    from multicall.core.firewall.model import ProxyInitOptions

    return ProxyInitOptions(
        incoming_proxy_port=netconf.incoming_proxy_port,
        outgoing_proxy_port=netconf.outgoing_proxy_port,
        proxy_uid=netconf.proxy_uid,
        proxy_gid=netconf.proxy_gid,
        ports_to_redirect=netconf.ports_to_redirect,
        inbound_ports_to_ignore=netconf.inbound_ports_to_ignore,
        outbound_ports_to_ignore=netconf.outbound_ports_to_ignore,
        subnets_to_ignore=netconf.subnets_to_ignore,
        use_wait_flag=netconf.use_wait_flag,
    )


def mode_of(netconf: NetConf) -> Mode:
    """`linkerd.iptables-mode` ("" means legacy, for configs older than the key)."""
    from multicall.core.firewall.model import Mode

    text = netconf.iptables_mode or "legacy"
    for mode in Mode:
        if mode.value == text:
            return mode
    raise CniError(CNI_INTERNAL, MODE_ERROR)

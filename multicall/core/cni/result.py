"""CNI results as containernetworking/cni v1.3.0's `types` package models them: the result
types of each spec version, the typed decode of a prevResult, the converter graph between
versions, and the bytes `Result.Print` writes.

Rules of this module:
1. Results are parsed with the result type the *config's* cniVersion selects, up-converted to
   1.1.0 and printed converted to the config's version, through the same converter graph as
   the Go library, so every error text on the way is the library's.
2. Output bytes: results are 4-space indented without a trailing newline; 0.x key order is
   the struct order, 1.x keys are sorted and an empty `dns` is dropped.

One file (~500 lines) because the result types, their decode schemas and the converter
graph are one table of the Go library: a converter reads the fields of two versions' types
at once, so split by version each module would import every other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from multicall.core.cni.skel import IMPLEMENTED_VERSION
from multicall.core.go.encoding_json.decode import (
    CIDR,
    INT,
    IP,
    STRING,
    Slice,
    Struct,
    decode,
    field_int,
    field_opt_int,
    field_opt_str,
    field_str,
    field_strs,
    field_struct,
    field_structs,
)
from multicall.core.go.encoding_json.encode import marshal
from multicall.core.go.encoding_json.scanner import GoJsonError
from multicall.core.go.net import is_ipv4_text
from multicall.core.go.strconv import go_quote

# --- result types -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interface:
    """One entry of a CNI result's `interfaces`."""

    name: str = ""
    mac: str = ""
    mtu: int = 0
    sandbox: str = ""
    socket_path: str = ""
    pci_id: str = ""


@dataclass(frozen=True, slots=True)
class IPConfig:
    """One entry of a CNI result's `ips`."""

    address: str  # Go's IPNet.String(): the address keeps its host bits
    interface: int | None = None
    gateway: str | None = None
    version: str = ""  # only meaningful in 0.3.x/0.4.0 results as parsed


@dataclass(frozen=True, slots=True)
class Route:
    """One entry of a CNI result's `routes`."""

    dst: str
    gw: str | None = None
    mtu: int = 0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None


@dataclass(frozen=True, slots=True)
class DNS:
    """A CNI result's `dns` object."""

    nameservers: tuple[str, ...] = ()
    domain: str = ""
    search: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.nameservers or self.domain or self.search or self.options)


@dataclass(frozen=True, slots=True)
class Legacy:
    """A 0.1.0/0.2.0 `ip4`/`ip6` block."""

    ip: str
    gateway: str | None = None
    routes: tuple[Route, ...] = ()


@dataclass(frozen=True, slots=True)
class Result:
    """A result in any spec version; `ip4`/`ip6` only for 0.1.0/0.2.0."""

    cni_version: str
    interfaces: tuple[Interface, ...] = ()
    ips: tuple[IPConfig, ...] = ()
    routes: tuple[Route, ...] = ()
    dns: DNS = field(default_factory=DNS)
    ip4: Legacy | None = None
    ip6: Legacy | None = None


_Step = Callable[[Result, str], Result]

FAMILIES = {
    "020": ("", "0.1.0", "0.2.0"),
    "040": ("0.3.0", "0.3.1", "0.4.0"),
    "100": ("1.0.0", "1.1.0"),
}


def family_of(version: str) -> str | None:
    for family, versions in FAMILIES.items():
        if version in versions:
            return family
    return None


# Types with their own UnmarshalJSON decode into a private twin: Go's errors name the twin.
_ROUTE = Struct(
    "route",
    "types.route",
    (
        ("dst", CIDR),
        ("gw", IP),
        ("mtu", INT),
        ("advmss", INT),
        ("priority", INT),
        ("table", INT),
        ("scope", INT),
    ),
    own_unmarshal=True,
)
_STRINGS = Slice(STRING, "[]string")
_DNS = Struct(
    "DNS",
    "types.DNS",
    (("nameservers", _STRINGS), ("domain", STRING), ("search", _STRINGS), ("options", _STRINGS)),
)
_IPC020 = Struct(
    "ipConfig",
    "types020.ipConfig",
    (("ip", CIDR), ("gateway", IP), ("routes", Slice(_ROUTE, "[]types.Route"))),
    own_unmarshal=True,
)
_IPC040 = Struct(
    "ipConfig",
    "types040.ipConfig",
    (("version", STRING), ("interface", INT), ("address", CIDR), ("gateway", IP)),
    own_unmarshal=True,
)
_IPC100 = Struct(
    "ipConfig",
    "types100.ipConfig",
    (("interface", INT), ("address", CIDR), ("gateway", IP)),
    own_unmarshal=True,
)
_IF040 = Struct(
    "Interface", "types040.Interface", (("name", STRING), ("mac", STRING), ("sandbox", STRING))
)
_IF100 = Struct(
    "Interface",
    "types100.Interface",
    (
        ("name", STRING),
        ("mac", STRING),
        ("mtu", INT),
        ("sandbox", STRING),
        ("socketPath", STRING),
        ("pciID", STRING),
    ),
)
_RESULT_SCHEMAS = {
    "020": Struct(
        "Result",
        "types020.Result",
        (("cniVersion", STRING), ("ip4", _IPC020), ("ip6", _IPC020), ("dns", _DNS)),
    ),
    "040": Struct(
        "Result",
        "types040.Result",
        (
            ("cniVersion", STRING),
            ("interfaces", Slice(_IF040, "[]*types040.Interface")),
            ("ips", Slice(_IPC040, "[]*types040.IPConfig")),
            ("routes", Slice(_ROUTE, "[]*types.Route")),
            ("dns", _DNS),
        ),
    ),
    "100": Struct(
        "Result",
        "types100.Result",
        (
            ("cniVersion", STRING),
            ("interfaces", Slice(_IF100, "[]*types100.Interface")),
            ("ips", Slice(_IPC100, "[]*types100.IPConfig")),
            ("routes", Slice(_ROUTE, "[]*types.Route")),
            ("dns", _DNS),
        ),
    ),
}


class ResultError(ValueError):
    """A result could not be created or converted; `str()` is the Go library's text."""


def create_result(version: str, raw: Mapping[str, object]) -> Result:
    """version.NewResult(version, json.Marshal(raw))."""
    family = family_of(version) if version else None
    if family is None:
        raise ResultError(f"unsupported CNI result version {go_quote(version)}")
    # json.Marshal of a Go map sorts its keys: that is the order the typed decode sees.
    data = marshal(raw, sort_keys=True).encode()
    try:
        fields = decode(data, _RESULT_SCHEMAS[family])
    except GoJsonError as exc:
        raise ResultError(str(exc)) from None
    result = _result_from_fields(fields)
    if result.cni_version not in FAMILIES[family]:
        supported = "[" + " ".join(FAMILIES[family]) + "]"
        raise ResultError(
            f"result type supports {supported} but unmarshalled CNIVersion is "
            f"{go_quote(result.cni_version)}"
        )
    if family == "020" and result.cni_version == "":
        return _replace_version(result, "0.1.0")
    return result


def _route(f: Mapping[str, object]) -> Route:
    return Route(
        dst=field_str(f, "dst") or "<nil>",
        gw=field_opt_str(f, "gw"),
        mtu=field_int(f, "mtu"),
        advmss=field_int(f, "advmss"),
        priority=field_int(f, "priority"),
        table=field_opt_int(f, "table"),
        scope=field_opt_int(f, "scope"),
    )


def _legacy(value: object) -> Legacy | None:
    if not isinstance(value, dict):
        return None
    routes = tuple(_route(r) for r in field_structs(value, "routes"))
    return Legacy(
        ip=field_str(value, "ip") or "<nil>", gateway=field_opt_str(value, "gateway"), routes=routes
    )


def _result_from_fields(f: Mapping[str, object]) -> Result:
    dns_map = field_struct(f, "dns")
    return Result(
        cni_version=field_str(f, "cniVersion"),
        interfaces=tuple(
            Interface(
                name=field_str(i, "name"),
                mac=field_str(i, "mac"),
                mtu=field_int(i, "mtu"),
                sandbox=field_str(i, "sandbox"),
                socket_path=field_str(i, "socketPath"),
                pci_id=field_str(i, "pciID"),
            )
            for i in field_structs(f, "interfaces")
        ),
        ips=tuple(
            IPConfig(
                address=field_str(c, "address") or "<nil>",
                interface=field_opt_int(c, "interface"),
                gateway=field_opt_str(c, "gateway"),
                version=field_str(c, "version"),
            )
            for c in field_structs(f, "ips")
        ),
        routes=tuple(_route(r) for r in field_structs(f, "routes")),
        dns=DNS(
            nameservers=field_strs(dns_map, "nameservers"),
            domain=field_str(dns_map, "domain"),
            search=field_strs(dns_map, "search"),
            options=field_strs(dns_map, "options"),
        ),
        ip4=_legacy(f.get("ip4")),
        ip6=_legacy(f.get("ip6")),
    )


def _replace_version(result: Result, version: str) -> Result:
    return Result(
        version, result.interfaces, result.ips, result.routes, result.dns, result.ip4, result.ip6
    )


# --- the converter graph (types/internal/convert.go and the converters each type registers) ---


def convert(result: Result, to_version: str) -> Result:
    """convert.Convert: same version is a no-op, else the registered converter, else error."""
    to_version = to_version or "0.1.0"
    src = result.cni_version
    if src == to_version:
        return result
    step = _converter(src, to_version)
    if step is None:
        raise ResultError(f"no converter for CNI result version {src} to {to_version}")
    return step(result, to_version)


def _converter(src: str, dst: str) -> _Step | None:
    fam_src, fam_dst = family_of(src), family_of(dst)
    if src == "" or fam_src is None or fam_dst is None:
        return None
    table: dict[tuple[str, str], _Step] = {
        ("020", "020"): _within_020,
        ("020", "040"): _from_020_to_040,
        ("040", "040"): _within_040,
        ("040", "020"): _from_040_to_020,
        ("020", "100"): _from_020_to_100,
        ("040", "100"): _from_040_to_100,
        ("100", "100"): _within_100,
        ("100", "040"): _from_100_to_040,
        ("100", "020"): _from_100_to_020,
    }
    return table.get((fam_src, fam_dst))


def _within_020(result: Result, version: str) -> Result:
    return _replace_version(result, version)


def _from_020_to_040(result: Result, version: str) -> Result:
    ips: list[IPConfig] = []
    routes: list[Route] = []
    for block, ip_version in ((result.ip4, "4"), (result.ip6, "6")):
        if block is not None:
            ips.append(IPConfig(address=block.ip, gateway=block.gateway, version=ip_version))
            routes.extend(block.routes)
    return Result(version, (), tuple(ips), tuple(routes), result.dns)


def _within_040(result: Result, version: str) -> Result:
    return Result(version, result.interfaces, result.ips, result.routes, result.dns)


def _from_040_to_020(result: Result, version: str) -> Result:
    ip4: Legacy | None = None
    ip6: Legacy | None = None
    for ip in result.ips:
        if ip.version == "4" and ip4 is None:
            ip4 = Legacy(ip.address, ip.gateway)
        elif ip.version == "6" and ip6 is None:
            ip6 = Legacy(ip.address, ip.gateway)
        if ip4 is not None and ip6 is not None:
            break
    r4: list[Route] = []
    r6: list[Route] = []
    for route in result.routes:
        is4 = is_ipv4_text(route.dst)
        if is4 and ip4 is not None:
            r4.append(Route(route.dst, route.gw))
        elif not is4 and ip6 is not None:
            r6.append(Route(route.dst, route.gw))
    if ip4 is None and ip6 is None:
        raise ResultError("cannot convert: no valid IP addresses")
    if ip4 is not None:
        ip4 = Legacy(ip4.ip, ip4.gateway, tuple(r4))
    if ip6 is not None:
        ip6 = Legacy(ip6.ip, ip6.gateway, tuple(r6))
    return Result(version, dns=result.dns, ip4=ip4, ip6=ip6)


def _from_020_to_100(result: Result, version: str) -> Result:
    return _from_040_to_100(convert(result, "0.4.0"), version)


def _from_040_to_100(result: Result, version: str) -> Result:
    interfaces = tuple(Interface(i.name, i.mac, sandbox=i.sandbox) for i in result.interfaces)
    ips = tuple(IPConfig(ip.address, ip.interface, ip.gateway) for ip in result.ips)
    return Result(version, interfaces, ips, result.routes, result.dns)


def _within_100(result: Result, version: str) -> Result:
    return _replace_version(result, version)


def _from_100_to_040(result: Result, version: str) -> Result:
    interfaces = tuple(Interface(i.name, i.mac, sandbox=i.sandbox) for i in result.interfaces)
    ips = tuple(
        IPConfig(
            ip.address,
            ip.interface,
            ip.gateway,
            version="4" if is_ipv4_text(ip.address) else "6",
        )
        for ip in result.ips
    )
    return Result(version, interfaces, ips, result.routes, result.dns)


def _from_100_to_020(result: Result, version: str) -> Result:
    return convert(_from_100_to_040(result, "0.4.0"), version)


# --- rendering --------------------------------------------------------------------------------


def _route_obj(route: Route) -> dict[str, object]:
    out: dict[str, object] = {"dst": route.dst}
    if route.gw:
        out["gw"] = route.gw
    for key, value in (("mtu", route.mtu), ("advmss", route.advmss), ("priority", route.priority)):
        if value:
            out[key] = value
    if route.table is not None:
        out["table"] = route.table
    if route.scope is not None:
        out["scope"] = route.scope
    return out


def _dns_obj(dns: DNS) -> dict[str, object]:
    out: dict[str, object] = {}
    if dns.nameservers:
        out["nameservers"] = list(dns.nameservers)
    if dns.domain:
        out["domain"] = dns.domain
    if dns.search:
        out["search"] = list(dns.search)
    if dns.options:
        out["options"] = list(dns.options)
    return out


def _interface_obj(i: Interface, *, v1: bool) -> dict[str, object]:
    out: dict[str, object] = {"name": i.name}
    if i.mac:
        out["mac"] = i.mac
    if v1 and i.mtu:
        out["mtu"] = i.mtu
    if i.sandbox:
        out["sandbox"] = i.sandbox
    if v1 and i.socket_path:
        out["socketPath"] = i.socket_path
    if v1 and i.pci_id:
        out["pciID"] = i.pci_id
    return out


def _ip_obj(ip: IPConfig, *, v1: bool) -> dict[str, object]:
    out: dict[str, object] = {} if v1 else {"version": ip.version}
    if ip.interface is not None:
        out["interface"] = ip.interface
    out["address"] = ip.address
    if ip.gateway:
        out["gateway"] = ip.gateway
    return out


def _legacy_obj(block: Legacy) -> dict[str, object]:
    out: dict[str, object] = {"ip": block.ip}
    if block.gateway:
        out["gateway"] = block.gateway
    if block.routes:
        out["routes"] = [_route_obj(r) for r in block.routes]
    return out


def result_object(result: Result) -> dict[str, object]:
    """The result as the Go type for its version marshals it (key order included)."""
    family = family_of(result.cni_version) or "100"
    out: dict[str, object] = {}
    if result.cni_version:
        out["cniVersion"] = result.cni_version
    if family == "020":
        if result.ip4 is not None:
            out["ip4"] = _legacy_obj(result.ip4)
        if result.ip6 is not None:
            out["ip6"] = _legacy_obj(result.ip6)
        out["dns"] = _dns_obj(result.dns)
        return out
    v1 = family == "100"
    if result.interfaces:
        out["interfaces"] = [_interface_obj(i, v1=v1) for i in result.interfaces]
    if result.ips:
        out["ips"] = [_ip_obj(ip, v1=v1) for ip in result.ips]
    if result.routes:
        out["routes"] = [_route_obj(r) for r in result.routes]
    if not v1 or not result.dns.empty:
        out["dns"] = _dns_obj(result.dns)
    return out


def render_result(result: Result) -> bytes:
    """Result.PrintTo: 1.x results go through a map in Go, so their keys come out sorted."""
    v1 = family_of(result.cni_version) == "100"
    return marshal(result_object(result), indent=4, sort_keys=v1).encode()


def print_result(result: Result, version: str) -> bytes:
    """types.PrintResult(result, version)."""
    return render_result(convert(result, version))


def empty_result() -> Result:
    """`&cniv1.Result{CNIVersion: "1.1.0"}`: what a stand-alone ADD passes on."""
    return Result(IMPLEMENTED_VERSION)

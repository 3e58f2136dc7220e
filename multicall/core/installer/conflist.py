"""The CNI network-config patcher of `install-cni`: bytes in, bytes out.

Rules of this module (the Go installer `linkerd2-cni-install` is the reference,
`internal/cni/conf.go` `inject` and `remove.go` `revert`):
1. A document with a top-level `type` is a single-plugin config: it becomes
   `{"cniVersion": "0.3.1", "name": "k8s-pod-network", "plugins": [it minus cniVersion, linkerd]}`.
   Anything else must hold `plugins`, a list of objects; the linkerd entry (`type` equal to
   `linkerd-cni`) is taken out and appended last, so a list where linkerd came first is
   reordered.
2. Output is what Go's `json.MarshalIndent(v, "", "  ")` prints for a decoded document: keys
   sorted, two-space indent, no trailing newline, `<`, `>`, `&`, U+2028 and U+2029 escaped,
   other non-ASCII text as UTF-8, non-integer numbers in Go's float64 notation.
3. Differences from Go, all in the direction of the "at most one linkerd entry" invariant:
   every linkerd entry is removed (Go removes the first), and a single-plugin config that is
   itself `linkerd-cni` is refused (Go wraps it into a list holding linkerd twice), and so
   is a plugin list with nothing but linkerd in it, `[]` included (Go makes it a
   linkerd-only list, a network config of its own ahead of the real one). Integer
   literals are kept exact (Go rounds those beyond 2^53 through float64).
4. Every rejection is a `ConfigError`; callers log it and leave the file alone.
"""

from __future__ import annotations

import json
from typing import Union

from multicall.core.go.encoding_json.decode import scrub_text
from multicall.core.go.encoding_json.encode import Rendered, marshal
from multicall.core.limits import CONFIG_JSON_VALUES, too_many_json_values
from multicall.errors import ConfigError

LINKERD_TYPE = "linkerd-cni"
WRAPPED_NAME = "k8s-pod-network"
WRAPPED_CNI_VERSION = "0.3.1"

# A decoded JSON document. Recursive aliases need Union spelled out for mypy.
Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]  # noqa: UP007


class _Rejected(ValueError):
    """Internal: a constant Go's decoder would not accept (NaN, Infinity)."""


def _reject_constant(token: str) -> float:
    raise _Rejected(f"invalid JSON literal {token}")


def _parse_float(token: str) -> float:
    value = float(token)
    if value in (float("inf"), float("-inf")):
        shown = token if len(token) <= 40 else f"{token[:20]}...({len(token)} characters)"
        raise _Rejected(f"number {shown} out of range")  # a 5,000-digit number is not echoed
    return value


def _parse_int(literal: str) -> int | float:
    # Go decodes every number as float64: `-0` is negative zero, printed back as `-0`. Past
    # 309 digits it is beyond float64 (Go's range error), and `int()` must not see it:
    # CPython refuses over 4,300 digits with a ValueError text of its own.
    if len(literal.lstrip("-")) > 309:
        return _parse_float(literal)
    return -0.0 if literal == "-0" else int(literal)


def parse_document(data: bytes, what: str = "document") -> dict[str, Json]:
    """A JSON object from bytes; ConfigError for anything else."""
    refused = too_many_json_values(data, CONFIG_JSON_VALUES)
    if refused:
        raise ConfigError(f"{what} is refused: {refused}")
    try:
        value: Json = json.loads(
            data.decode("utf-8", "replace"),
            parse_constant=_reject_constant,
            parse_float=_parse_float,
            parse_int=_parse_int,
        )
    except RecursionError:
        raise ConfigError(f"{what} is not valid JSON: nested too deeply") from None
    except ValueError as exc:
        raise ConfigError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{what} is not a JSON object")
    if b"\\u" in data:  # only an escape can make a lone surrogate, which Go reads as U+FFFD
        _scrub_surrogates(value)
    return value


def _scrub_surrogates(document: dict[str, Json]) -> None:
    """Replace lone surrogates in keys and strings, in place, without recursion."""
    work: list[dict[str, Json] | list[Json]] = [document]
    while work:
        node = work.pop()
        if isinstance(node, dict):
            items = list(node.items())
            node.clear()
            node.update((scrub_text(k), v) for k, v in items)
            slots: list[tuple[str | int, Json]] = list(node.items())
        else:
            slots = list(enumerate(node))
        for slot, item in slots:
            if isinstance(item, str):
                node[slot] = scrub_text(item)  # type: ignore[index]  # str for dicts, int for lists
            elif isinstance(item, dict | list):
                work.append(item)


def is_linkerd(plugin: Json) -> bool:
    return isinstance(plugin, dict) and plugin.get("type") == LINKERD_TYPE


def _plugins_of(document: dict[str, Json]) -> list[Json]:
    plugins = document.get("plugins")
    if not isinstance(plugins, list):
        raise ConfigError("cannot determine plugins from existing cni configuration")
    if not all(isinstance(p, dict) for p in plugins):
        raise ConfigError("cannot extract plugin from configuration")
    return plugins


def insert_linkerd(
    existing: bytes | dict[str, Json],
    linkerd: bytes | dict[str, Json],
    *,
    rendered: Rendered | None = None,
) -> bytes:
    """The config `existing` with the linkerd plugin `linkerd` chained last, Go-formatted.
    Either may be given parsed (`parse_document`'s, not changed here): the installer parses
    its plugin once, and each config once for this and `remove_linkerd`. `rendered`:
    `render_plugin(linkerd)`, made once by a caller patching many configs (the same bytes
    out, the plugin's share of the rendering not repeated per config)."""
    document = _parsed(existing, "existing CNI configuration")
    parsed = _parsed(linkerd, "linkerd network configuration")
    plugin: Json = parsed if rendered is None else rendered
    if "type" in document:
        if is_linkerd(document):
            raise ConfigError("a single-plugin config of type linkerd-cni is not a primary config")
        single = {k: v for k, v in document.items() if k != "cniVersion"}
        wrapped: dict[str, Json] = {
            "name": WRAPPED_NAME,
            "cniVersion": WRAPPED_CNI_VERSION,
            "plugins": [single, plugin],
        }
        return render_go_json(wrapped)
    others = [p for p in _plugins_of(document) if not is_linkerd(p)]
    if not others:
        # libcni refuses an empty list; a linkerd-only list would be a config of its own
        # that sorts ahead of the real one (rule 3).
        raise ConfigError("the plugin list holds no plugin besides linkerd-cni")
    return render_go_json({**document, "plugins": [*others, plugin]})


def remove_linkerd(existing: bytes | dict[str, Json]) -> bytes | None:
    """The config without its linkerd entries, Go-formatted; None when it has none."""
    document = _parsed(existing, "CNI configuration")
    plugins = _plugins_of(document)
    kept = [p for p in plugins if not is_linkerd(p)]
    if len(kept) == len(plugins):
        return None
    return render_go_json({**document, "plugins": kept})


def _parsed(value: bytes | dict[str, Json], what: str) -> dict[str, Json]:
    return value if isinstance(value, dict) else parse_document(value, what)


def upgraded_name(filename: str) -> str:
    """Where the patched form of `filename` is written: `x.conf` becomes `x.conflist`."""
    return filename + "list" if filename.endswith(".conf") else filename


def is_cni_config_name(filename: str) -> bool:
    """The names the Go installer reconfigures (`path.Ext` exactly .conf or .conflist)."""
    base = filename.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return dot >= 0 and base[dot:] in (".conf", ".conflist")


def render_plugin(linkerd: dict[str, Json]) -> Rendered:
    """The linkerd plugin as `insert_linkerd` writes it, for its `rendered`."""
    return Rendered(marshal(linkerd, indent=2, sort_keys=True))


def render_go_json(value: Json) -> bytes:
    """`json.MarshalIndent(v, "", "  ")` of a decoded document (map keys sorted, as Go's)."""
    return marshal(value, indent=2, sort_keys=True).encode("utf-8")

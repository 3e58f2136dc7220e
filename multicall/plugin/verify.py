"""iptables-verify's comparison (applets/iptables_verify.py has its usage and flags): the
nat table linkerd-cni would give a pod, from its network config and the pod (files, or the
API as ADD reads it; `plugin/expected.py` computes it as CHECK does), the table the pod has
(a save text, or a live network namespace), and the report of their difference as text or
JSON (docs/iptables-verify.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from multicall.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from multicall.core.firewall.diff import RulesetDiff
    from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
    from multicall.core.firewall.ruleset import Table
    from multicall.core.kube.objects import Service
    from multicall.plugin.pod_inputs import PodInputs

JSON_SCHEMA = "cnibox.iptables-verify/v1"


@dataclass(frozen=True, slots=True)
class Options:
    """The verifier's command line, parsed."""

    config: str = ""
    pod: str | None = None
    namespace_object: str | None = None
    namespace: str | None = None  # with it, --pod names a pod to fetch from the API
    kubeconfig: str | None = None
    service: str | None = None
    input: str | None = None
    netns: str | None = None
    pid: str | None = None
    family: str = "ipv4"
    mode: str | None = None  # "legacy" | "nft" | "nftables"; None: the config's iptables-mode
    strict: bool = False
    json: bool = False
    quiet: bool = False


# ----------------------------------------------------------------------------- inputs


def read_bytes(path: str, stdin: BinaryIO, option: str) -> bytes:
    """The file an option names (or stdin for '-'): a regular file of at most OBJECT_FILE
    bytes, opened without blocking (effects/inputs.py); errors name the option."""
    from multicall.core.limits import OBJECT_FILE
    from multicall.effects.inputs import read_file, read_stream

    if path == "-":
        return read_stream(stdin, limit=OBJECT_FILE, what=f"{option} - (standard input)")
    return read_file(path, limit=OBJECT_FILE, what=option)


def plugin_config(data: bytes, path: str) -> bytes:
    """The linkerd-cni entry of a conflist (with the list's name and cniVersion, as libcni
    passes them), or the document itself when it is a single plugin config."""
    import json

    from multicall.core.installer.conflist import is_linkerd, parse_document

    document = parse_document(data, path)
    plugins = document.get("plugins")
    if "type" in document or not isinstance(plugins, list):
        return data
    entry = next((p for p in plugins if is_linkerd(p)), None)
    if not isinstance(entry, dict):
        raise ConfigError(f"{path}: the conflist has no plugin of type linkerd-cni")
    merged = {**entry, "name": document.get("name"), "cniVersion": document.get("cniVersion")}
    return json.dumps(merged).encode()


def load_object(path: str, stdin: BinaryIO, option: str) -> Mapping[str, object]:
    """A Kubernetes object from a JSON or YAML file."""
    import json

    data = read_bytes(path, stdin, option)
    try:
        doc: object = json.loads(data)
    except (ValueError, RecursionError):
        doc = _load_yaml(data, path)
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}: expected a Kubernetes object (a JSON/YAML mapping)")
    return doc


def _load_yaml(data: bytes, path: str) -> object:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(data, Loader=loader)  # noqa: S506 - a safe loader, chosen above
    except RecursionError:
        raise ConfigError(f"{path}: neither JSON nor YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: neither JSON nor YAML: {exc}") from None


@dataclass(frozen=True, slots=True)
class Expectation:
    """The rules a pod should have, and why."""

    table: Table
    mode: Mode
    pod: str | None  # "namespace/name" when a pod was given
    meshed: bool
    note: str  # why no rules are expected, when none are
    native: tuple[str, ...] = ()  # nftables mode: the tables as `nft list table` prints them
    options: ProxyInitOptions | None = None  # what ADD programs (None: no rules)
    family: Family | None = None
    backend: str = "legacy"

    def against(self, present: Table) -> Expectation:
        """The expectation once the live table is known: the jumps ADD kept there count
        (plugin/expected.py rule 3), as CHECK counts them."""
        from dataclasses import replace

        from multicall.plugin.expected import expected_for_pod

        if self.options is None or self.family is None:
            return self
        table = expected_for_pod(self.options, self.family, backend=self.backend, present=present)
        return replace(self, table=table)


def expected(opts: Options, stdin: BinaryIO, env: Mapping[str, str]) -> Expectation:
    """The nat table the plugin would leave, from the same core code as its ADD."""
    from multicall.core.cni.netconf import base_options, mode_of, parse_netconf
    from multicall.core.firewall.model import Family, Mode
    from multicall.plugin.expected import expected_for_pod, options_for_pod

    netconf = parse_netconf(plugin_config(read_bytes(opts.config, stdin, "--config"), opts.config))
    mode = Mode(opts.mode) if opts.mode else mode_of(netconf)
    family = Family(opts.family)
    base = base_options(netconf)
    options: ProxyInitOptions | None = base
    pod_name, note = None, ""
    if opts.pod is not None:
        inputs = _pod_inputs(opts, stdin, env, netconf.kubeconfig)
        pod_name = f"{inputs.pod.namespace}/{inputs.pod.name}"
        found = options_for_pod(base, inputs)
        options = found.options
        if options is None:
            note = found.decision.message.removeprefix("linkerd-cni: ")
    if options is not None and family is Family.IPV6 and not netconf.ipv6:
        options, note = None, "the config does not enable IPv6 (linkerd.ipv6), so no rules"
    if options is not None and netconf.simulate:
        options, note = None, "the config sets simulate: ADD only logs its commands, so no rules"
    backend = mode.value if mode in (Mode.LEGACY, Mode.NFT) else "legacy"
    table = expected_for_pod(options, family, backend=backend)
    native: tuple[str, ...] = ()
    if mode is Mode.NFTABLES:
        from multicall.core.firewall.nft.native import native_table, render

        native = tuple(render(native_table(options, family) if options else None, family))
    return Expectation(
        table, mode, pod_name, options is not None, note, native, options, family, backend
    )


def _pod_inputs(
    opts: Options, stdin: BinaryIO, env: Mapping[str, str], kubeconfig: str
) -> PodInputs:
    """The pod, its namespace's annotations and the API service, from files or the API."""
    from multicall.core.kube.objects import parse_namespace, parse_pod, parse_service
    from multicall.plugin.pod_inputs import PodInputs

    assert opts.pod is not None
    namespace = service = None
    if opts.namespace_object is not None:
        namespace = parse_namespace(
            load_object(opts.namespace_object, stdin, "--namespace-object")
        ).annotations
    if opts.service is not None:
        service = parse_service(load_object(opts.service, stdin, "--service"))
    if opts.namespace is None:
        return PodInputs(parse_pod(load_object(opts.pod, stdin, "--pod")), namespace, service)
    return _fetch(opts, env, kubeconfig, namespace, service)


def _fetch(
    opts: Options,
    env: Mapping[str, str],
    kubeconfig: str,
    namespace: Mapping[str, str] | None,
    service: Service | None,
) -> PodInputs:
    """What ADD reads from the API, except what was given as files."""
    from multicall.effects.kube.client import KubeClient
    from multicall.effects.kube.config import read_kubeconfig, timeout_from_env
    from multicall.plugin.pod_inputs import read_pod_inputs

    assert opts.namespace is not None
    assert opts.pod is not None
    path = opts.kubeconfig or kubeconfig
    if not path:
        raise UsageError("--namespace needs --kubeconfig (the config names no kubeconfig)")
    timeout = timeout_from_env(env)
    client = KubeClient(read_kubeconfig(path), timeout=timeout)
    try:
        return read_pod_inputs(
            client, opts.namespace, opts.pod, namespace_annotations=namespace, service=service
        )
    finally:
        client.close()


@dataclass(frozen=True, slots=True)
class Actual:
    """The rules found (in a save text or a live netns), and where."""

    table: Table
    source: str  # the file, <stdin>, or the netns path
    warnings: tuple[str, ...] = ()  # iptables-nft-save's "# Warning: ..." lines
    raw: Table | None = None  # the raw table, judged for untracking (diff.untracked)


def actual(opts: Options, mode: Mode, stdin: BinaryIO) -> Actual:
    """The nat table to check, and where it came from."""
    if opts.input is not None:
        return read_save_input(opts.input, stdin, strict=opts.strict)
    path = opts.netns if opts.netns is not None else f"/proc/{opts.pid}/ns/net"
    from multicall.core.firewall.model import Family
    from multicall.effects.firewall.engine import dump_nat
    from multicall.effects.ns import NetnsRef
    from multicall.errors import FirewallError

    # Reading is harmless, so the verifier's own namespace may be inspected too.
    netns = NetnsRef(path, allow_own=True)
    table = dump_nat(netns, mode=mode, family=Family(opts.family))
    try:
        raw = dump_nat(netns, mode=mode, family=Family(opts.family), table="raw")
    except FirewallError as exc:  # a raw rule the nft codec cannot read: nat is still judged
        return Actual(table, path, (f"# Warning: the raw table was not judged: {exc.message}",))
    return Actual(table, path, raw=raw)


def read_save_input(path: str, stdin: BinaryIO, *, strict: bool) -> Actual:
    """The last nat table of a save text, streamed: one line in memory at a time, and of the
    table only what the comparison looks at (all of it with --strict)."""
    from functools import partial

    from multicall.core.firewall.diff import may_matter, may_matter_raw
    from multicall.core.firewall.iptables_save import read_last_tables
    from multicall.core.firewall.proxy_init import empty_table
    from multicall.core.limits import SAVE_LINE, SAVE_TOTAL
    from multicall.effects.inputs import lines, open_input

    source = "<stdin>" if path == "-" else path
    what = "--input - (standard input)" if path == "-" else f"--input {path}"
    stream = stdin if path == "-" else open_input(path, "--input")
    try:
        numbered = lines(stream, max_line=SAVE_LINE, max_total=SAVE_TOTAL, what=what)
        found, warnings = read_last_tables(
            ((n, line.decode("utf-8", "surrogateescape")) for n, line in numbered),
            {"nat": partial(may_matter, strict=strict), "raw": None if strict else may_matter_raw},
            source=source,
        )
    finally:
        if stream is not stdin:
            stream.close()
    # iptables-save prints no *nat block when the table was never instantiated.
    return Actual(found.get("nat") or empty_table(), source, warnings, found.get("raw"))


def native_actual(opts: Options, stdin: BinaryIO) -> tuple[list[str], str]:
    """nftables mode: the family's `linkerd-proxy-init` table as nft lists it, from a text
    (`nft list table` or `nft list ruleset` output) or a live netns, and where it came from."""
    from multicall.core.firewall.model import Family
    from multicall.core.firewall.nft.native import extract_table, render

    family = Family(opts.family)
    if opts.input is not None:
        text = read_bytes(opts.input, stdin, "--input").decode("utf-8", "surrogateescape")
        source = "<stdin>" if opts.input == "-" else opts.input
        return extract_table(text.splitlines(), family), source
    from multicall.effects.firewall.engine import dump_native
    from multicall.effects.ns import NetnsRef

    path = opts.netns if opts.netns is not None else f"/proc/{opts.pid}/ns/net"
    return render(dump_native(NetnsRef(path, allow_own=True), family=family), family), path


def native_report(opts: Options, want: Expectation, got: list[str], source: str) -> str:
    """The nftables mode's result: a unified diff of the two nft texts, as text or JSON."""
    import json

    from multicall.core.firewall.nft.native import TABLE, diff_text

    diff = diff_text(want.native, got, source)
    if opts.json:
        doc = {
            "schema": JSON_SCHEMA,
            "ok": not diff,
            "mode": "nftables",
            "family": opts.family,
            "source": source,
            "pod": want.pod,
            "meshed": want.meshed,
            "note": want.note or None,
            "expected": list(want.native),
            "actual": got,
            "diff": diff.splitlines(),
        }
        return json.dumps(doc, indent=2) + "\n"
    note = f"note: {want.note}\n" if want.note else ""
    head = f"{opts.family} {TABLE} table of {source}"
    return f"{note}{head}: {'as expected' if not diff else 'differs'}\n" + (
        f"{diff}\n" if diff else ""
    )


def format_json(diff: RulesetDiff, opts: Options, want: Expectation, got: Actual) -> str:
    import json

    from multicall.core.firewall.report import diff_to_json

    doc = {
        **diff_to_json(diff),
        "schema": JSON_SCHEMA,
        "family": opts.family,
        "source": got.source,
        "pod": want.pod,
        "meshed": want.meshed,
        "note": want.note or None,
        "warnings": list(got.warnings),
    }
    return json.dumps(doc, indent=2) + "\n"


def format_text(diff: RulesetDiff, opts: Options, want: Expectation, got: Actual) -> str:
    from multicall.core.firewall.report import format_diff, format_summary

    head = f"{opts.family} nat table of {got.source}"
    notes = [want.note] if want.note else []
    # "iptables-legacy tables present": the rules may sit in the other backend's tables.
    notes += [w.removeprefix("# ") for w in got.warnings]
    note = "".join(f"note: {n}\n" for n in notes)
    if diff.ok:
        return f"{note}{head}: {format_summary(diff).removeprefix('nat: ')}\n"
    return f"{note}{head}:\n{format_diff(diff)}"

"""The node readiness gate's pure half (docs/node-readiness.md): the startup taint, the Node
condition, the patches that change them, and the verdict of one check.

Rules of this module:
1. The taint is removed or re-added with a JSON patch whose first operation `test`s the
   taints list as read: a concurrent writer of any taint makes the patch fail (422) or
   conflict (409), and the caller re-reads and retries. Only our key and effect change; every
   other taint stays byte for byte as read.
2. The condition is written with a strategic merge patch on nodes/NAME/status, merged by
   `type` (the kubelet's conditions and anyone else's stay). `lastTransitionTime` moves only
   when the status flips, as the kubelet keeps its own conditions.
3. Bounds: a node's taints list larger than MAX_TAINTS or a message longer than MAX_MESSAGE
   is refused or cut here, before it reaches a request body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_TAINT_KEY = "linkerd-cni.cnibox.io/not-ready"
DEFAULT_TAINT_EFFECT = "NoSchedule"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CONDITION_TYPE = "LinkerdCNIReady"
MAX_TAINTS = 256  # a node with more is refused (the API caps a node's size well above)
MAX_MESSAGE = 1024  # the condition message: readable in `kubectl describe node`
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

# The checks in the order they run: the first false one names the condition's reason.
CHECKS = ("PluginInstalled", "ChainConfigured", "APIReachable", "AgentServing", "SelfTest")


class GateInputError(ValueError):
    """A node object the gate cannot work with (its taints are not a list of objects)."""


@dataclass(frozen=True, slots=True)
class Taint:
    """The gate's startup taint: the only one it ever adds or removes."""

    key: str = DEFAULT_TAINT_KEY
    effect: str = DEFAULT_TAINT_EFFECT

    def matches(self, taint: object) -> bool:
        return (
            isinstance(taint, Mapping)
            and taint.get("key") == self.key
            and taint.get("effect") == self.effect
        )

    def as_object(self) -> dict[str, object]:
        return {"key": self.key, "effect": self.effect}


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome: `name` is one of CHECKS, `detail` says why it failed."""

    name: str
    ok: bool
    detail: str = ""  # why it failed, one line


@dataclass(frozen=True, slots=True)
class Verdict:
    """All checks of one round: ready when every one passed."""

    results: tuple[CheckResult, ...]

    @property
    def ready(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def reason(self) -> str:
        """CamelCase, as condition reasons are: `Ready`, or the first failed check + `Failed`."""
        for result in self.results:
            if not result.ok:
                return f"{result.name}Failed"
        return "Ready" if self.results else "NotChecked"

    @property
    def message(self) -> str:
        if self.ready:
            return "linkerd-cni can program pods on this node: " + ", ".join(
                r.name for r in self.results
            )
        failed = [f"{r.name}: {r.detail}" for r in self.results if not r.ok]
        return bounded_message("; ".join(failed))


def bounded_message(text: str) -> str:
    text = " ".join(text.split())  # one line, whatever a detail carried
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def taints_of(node: Mapping[str, object]) -> list[object] | None:
    """The node's spec.taints as read (None: absent); GateInputError when malformed."""
    spec = node.get("spec")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise GateInputError("the node's spec is not an object")
    taints = spec.get("taints")
    if taints is None:
        return None
    if not isinstance(taints, list) or not all(isinstance(t, Mapping) for t in taints):
        raise GateInputError("the node's spec.taints is not a list of objects")
    if len(taints) > MAX_TAINTS:
        raise GateInputError(f"the node has more than {MAX_TAINTS} taints")
    return list(taints)


def resource_version(node: Mapping[str, object]) -> str:
    meta = node.get("metadata")
    value = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def has_taint(node: Mapping[str, object], taint: Taint) -> bool:
    return any(taint.matches(t) for t in taints_of(node) or [])


def remove_taint_patch(node: Mapping[str, object], taint: Taint) -> list[dict[str, object]] | None:
    """The JSON patch that removes exactly `taint` from the node as read (None: not there).

    It tests the whole list first: any change since the read fails the patch (rule 1)."""
    taints = taints_of(node)
    if taints is None or not any(taint.matches(t) for t in taints):
        return None
    kept = [t for t in taints if not taint.matches(t)]
    test: dict[str, object] = {"op": "test", "path": "/spec/taints", "value": taints}
    if not kept:
        return [test, {"op": "remove", "path": "/spec/taints"}]
    return [test, {"op": "replace", "path": "/spec/taints", "value": kept}]


def add_taint_patch(node: Mapping[str, object], taint: Taint) -> list[dict[str, object]] | None:
    """The JSON patch that puts `taint` back (None: already there). With no taints list to
    test, the resourceVersion is tested instead: nothing may have changed since the read."""
    taints = taints_of(node)
    if taints is not None and any(taint.matches(t) for t in taints):
        return None
    if taints is None:
        version = resource_version(node)
        if not version:
            raise GateInputError("the node has neither taints nor a resourceVersion to test")
        return [
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/spec/taints", "value": [taint.as_object()]},
        ]
    return [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "add", "path": "/spec/taints/-", "value": taint.as_object()},
    ]


def condition_of(node: Mapping[str, object]) -> Mapping[str, object] | None:
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return None
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == CONDITION_TYPE:
            return condition
    return None


def condition_patch(
    verdict: Verdict, previous: Mapping[str, object] | None, now: str
) -> dict[str, object] | None:
    """The strategic merge patch that sets our condition (None: it already says this).

    `now` is RFC 3339 (seconds, Z). The heartbeat is not refreshed when nothing changed: a
    write per check round would churn the node object for every watcher of nodes."""
    status = "True" if verdict.ready else "False"
    reason, message = verdict.reason, verdict.message
    if (
        previous is not None
        and previous.get("status") == status
        and previous.get("reason") == reason
        and previous.get("message") == message
    ):
        return None
    transition = now
    if previous is not None and previous.get("status") == status:
        kept = previous.get("lastTransitionTime")
        transition = kept if isinstance(kept, str) else now
    condition = {
        "type": CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition,
    }
    return {"status": {"conditions": [condition]}}


def remove_condition_patch() -> dict[str, object]:
    """Strategic merge: delete the list element whose merge key `type` is ours."""
    return {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}}


def parse_effect(value: str) -> str:
    if value not in EFFECTS:
        raise GateInputError(f"taint effect {value!r}: not one of {', '.join(EFFECTS)}")
    return value


def parse_taint_key(value: str) -> str:
    """A label-style key: optional DNS prefix and `/`, a name of ≤ 63 [A-Za-z0-9-_.]."""
    prefix, _, name = value.rpartition("/")
    ok_name = 0 < len(name) <= 63 and all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)
    ok_prefix = not prefix or (
        len(prefix) <= 253 and all(c.isascii() and (c.isalnum() or c in "-.") for c in prefix)
    )
    if not (ok_name and ok_prefix and name[0].isalnum() and name[-1].isalnum()):
        raise GateInputError(f"taint key {value!r}: not a valid Kubernetes taint key")
    return value


@dataclass(frozen=True, slots=True)
class GateConfig:
    """The gate's settings, from the installer's environment (the chart sets them)."""

    enabled: bool = False
    node: str = ""
    taint: Taint = Taint()
    reapply: bool = True  # taint again while the chain is broken (and at start, until ready)
    agent_socket: str = ""  # "" : no agent check
    interval: float = 10.0  # between rounds while ready
    retry: float = 0.25  # between rounds while not ready: the taint goes within ~1 s
    selftest: bool = True


def _truthy(value: str, name: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("", "0", "false", "no", "off"):
        return False
    raise GateInputError(f"{name}={value!r}: expected true or false")


def _seconds(value: str, name: str, default: float, low: float, high: float) -> float:
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not low <= seconds <= high:  # NaN fails too
        raise GateInputError(f"{name}={value!r}: expected seconds in [{low:g}, {high:g}]")
    return seconds


def parse_gate_env(env: Mapping[str, str]) -> GateConfig:
    """CNIBOX_GATE (true/false), NODE_NAME, CNIBOX_GATE_TAINT_KEY, CNIBOX_GATE_TAINT_EFFECT,
    CNIBOX_GATE_REAPPLY, CNIBOX_GATE_AGENT_SOCKET, CNIBOX_GATE_INTERVAL, CNIBOX_GATE_SELFTEST."""
    if not _truthy(env.get("CNIBOX_GATE", ""), "CNIBOX_GATE"):
        return GateConfig()
    node = env.get("NODE_NAME", "")
    if not node or len(node) > 253 or "/" in node:
        raise GateInputError("CNIBOX_GATE needs NODE_NAME: this node's name (spec.nodeName)")
    taint = Taint(
        parse_taint_key(env.get("CNIBOX_GATE_TAINT_KEY") or DEFAULT_TAINT_KEY),
        parse_effect(env.get("CNIBOX_GATE_TAINT_EFFECT") or DEFAULT_TAINT_EFFECT),
    )
    return GateConfig(
        enabled=True,
        node=node,
        taint=taint,
        reapply=_truthy(env.get("CNIBOX_GATE_REAPPLY", "true"), "CNIBOX_GATE_REAPPLY"),
        agent_socket=env.get("CNIBOX_GATE_AGENT_SOCKET", ""),
        interval=_seconds(
            env.get("CNIBOX_GATE_INTERVAL", ""), "CNIBOX_GATE_INTERVAL", 10.0, 1, 3600
        ),
        selftest=_truthy(env.get("CNIBOX_GATE_SELFTEST", "true"), "CNIBOX_GATE_SELFTEST"),
    )

"""What Linkerd's CNI repair controller decides, as pure functions: which pods to delete
(upstream's event filter, `cni-repair-controller/src/lib.rs`), the events.k8s.io/v1 Event it
publishes for each (kube-rs's `Recorder`), and the bounded memory that keeps a pod from being
deleted twice.

Rules of this module:
1. `verdict` is upstream's filter, field by field: the pod has a status; the FIRST init
   container status named `linkerd-network-validator` has `lastState.terminated.exitCode ==
   95`; and `metadata.deletionTimestamp` is unset. Nothing else about the pod matters.
2. `event_document` is the object kube-rs POSTs (keys in k8s-openapi's order, unset fields
   omitted, `eventTime` in MicroTime form, the name `<pod>.<unix nanos in hex>`).
3. Inputs are decoded JSON; a malformed field reads as absent, never as an exception.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from multicall.core.kube.watch import Selector
from multicall.core.tracing_log import timestamp

CONTROLLER = "linkerd-cni-repair-controller"
LOG_TARGET = "linkerd_cni_repair_controller"  # the Rust crate's name: log target, metric prefix
VALIDATOR = "linkerd-network-validator"
UNSUCCESSFUL_EXIT_CODE = 95  # ERRNO 95, "Operation not supported": the validator's failure
DATA_PLANE_LABEL = "linkerd.io/control-plane-ns"
QUEUE_CAPACITY = 32  # upstream's EVENT_CHANNEL_CAPACITY; overflow is dropped and counted
DELETE_TIMEOUT = 1.0  # seconds, for the delete and again for the event
EVENT_ACTION = "Deleting"
EVENT_REASON = "LinkerdCNINotConfigured"
EVENT_NOTE = "Deleting pod to create a new one with proper CNI config"
# cnibox's --repair-in-place announces itself with the same reason and its own action
REPAIR_ACTION = "Repairing"
REPAIR_NOTE = (
    "Programmed the Linkerd redirect in the pod's network namespace; "
    "the network validator's next attempt will pass"
)

Json = Mapping[str, object]


def pod_selector(node_name: str) -> Selector:
    """Pods injected by Linkerd (the label, any value) scheduled on this node."""
    return Selector(labels=DATA_PLANE_LABEL, fields=f"spec.nodeName={node_name}")


class Verdict(Enum):
    NO_STATUS = "no status"  # upstream logs "Skipped, no status"
    HEALTHY = "validator did not fail"
    DELETING = "already being deleted"
    REPAIR = "validator exited 95"


def _obj(value: object) -> Json:
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def validator_exit_code(pod: Json) -> int | None:
    """`lastState.terminated.exitCode` of the first `linkerd-network-validator` init status."""
    statuses = _obj(pod.get("status")).get("initContainerStatuses")
    for status in statuses if isinstance(statuses, list) else []:
        if isinstance(status, Mapping) and status.get("name") == VALIDATOR:
            terminated = _obj(_obj(status.get("lastState")).get("terminated"))
            return _int(terminated.get("exitCode"))
    return None


def verdict(pod: Json) -> Verdict:
    if not isinstance(pod.get("status"), Mapping):
        return Verdict.NO_STATUS
    if validator_exit_code(pod) != UNSUCCESSFUL_EXIT_CODE:
        return Verdict.HEALTHY
    if _obj(pod.get("metadata")).get("deletionTimestamp") is not None:
        return Verdict.DELETING
    return Verdict.REPAIR


def validator_finished_at(pod: Json) -> str:
    """When the failed validator run ended (RFC 3339), to tell a new failure from an old one."""
    statuses = _obj(pod.get("status")).get("initContainerStatuses")
    for status in statuses if isinstance(statuses, list) else []:
        if isinstance(status, Mapping) and status.get("name") == VALIDATOR:
            terminated = _obj(_obj(status.get("lastState")).get("terminated"))
            finished = terminated.get("finishedAt")
            return finished if isinstance(finished, str) else ""
    return ""


@dataclass(frozen=True, slots=True)
class PodRef:
    """A v1 ObjectReference to a pod, as kube-rs's `Resource::object_ref` builds it."""

    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""

    def object_reference(self) -> dict[str, str]:
        ref = {"apiVersion": "v1", "kind": "Pod", "name": self.name, "namespace": self.namespace}
        if self.resource_version:
            ref["resourceVersion"] = self.resource_version
        if self.uid:
            ref["uid"] = self.uid
        return ref

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_ref(pod: Json) -> PodRef:
    meta = _obj(pod.get("metadata"))

    def text(key: str) -> str:
        value = meta.get(key)
        return value if isinstance(value, str) else ""

    return PodRef(text("namespace"), text("name"), text("uid"), text("resourceVersion"))


def event_document(
    ref: PodRef,
    instance: str,
    nanos: int,
    *,
    action: str = EVENT_ACTION,
    note: str = EVENT_NOTE,
    reason: str = EVENT_REASON,
) -> dict[str, object]:
    """The events.k8s.io/v1 Event kube-rs's Recorder creates for `ref` at `nanos`."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "action": action,
        "eventTime": timestamp(nanos),  # k8s-openapi's MicroTime has the same form
        "metadata": {"name": f"{ref.name}.{nanos:x}", "namespace": ref.namespace},
        "note": note,
        "reason": reason,
        "regarding": ref.object_reference(),
        "reportingController": CONTROLLER,
        "reportingInstance": instance or CONTROLLER,
        "type": "Normal",
    }


class Recent:
    """A bounded set of pod UIDs, oldest forgotten first (what was deleted, what is queued)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key: str) -> None:
        self._items[key] = None
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def discard(self, key: str) -> None:
        self._items.pop(key, None)

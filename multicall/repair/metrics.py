"""The repair controller's metric families and their /metrics exposition (OpenMetrics text,
core/openmetrics.py): upstream's, then cnibox's own with --repair-in-place, then kubert's
process_* families."""

from __future__ import annotations

from multicall.core.openmetrics import Counter, Histogram, exposition
from multicall.core.repair import policy


class Metrics:
    """Upstream's metric families, in its registration order (prefix
    linkerd_cni_repair_controller_), then kubert's process_* families."""

    def __init__(self, *, repair_in_place: bool = False) -> None:
        self.queue_overflow = Counter(
            "queue_overflow", "Incremented whenever the event processing queue overflows"
        )
        self.pods_deleted = Counter("pods_deleted", "Number of pods deleted by the controller")
        self.pods_delete_latency = Histogram(
            "pods_delete_latency_seconds", "Pod deletion latency distribution"
        )
        self.pods_delete_errors = Counter(
            "pods_delete_errors", "Incremented whenever the pod deletion call errors out"
        )
        self.pods_delete_timeouts = Counter(
            "pods_delete_timeout", "Incremented whenever the pod deletion call times out"
        )
        self.events_publish_latency = Histogram(
            "events_publish_latency_seconds", "Events publish latency distribution"
        )
        self.events_publish_errors = Counter(
            "events_publish_errors", "Incremented whenever the event publishing call errors out"
        )
        self.events_publish_timeouts = Counter(
            "events_publish_timeouts", "Incremented whenever the event publishing call times out"
        )
        # cnibox's own, only with --repair-in-place (the default exposition is upstream's)
        self.pods_repaired = Counter(
            "pods_repaired", "Number of pods whose redirect was programmed in place (cnibox)"
        )
        self.pods_repair_skipped = Counter(
            "pods_repair_skipped",
            "Incremented whenever a pod could not be repaired in place and was deleted (cnibox)",
        )
        self.repair_in_place = repair_in_place

    def render(self) -> bytes:
        from multicall.effects.process_metrics import process_samples

        own: list[Counter | Histogram] = [
            self.queue_overflow,
            self.pods_deleted,
            self.pods_delete_latency,
            self.pods_delete_errors,
            self.pods_delete_timeouts,
            self.events_publish_latency,
            self.events_publish_errors,
            self.events_publish_timeouts,
        ]
        if self.repair_in_place:
            own += [self.pods_repaired, self.pods_repair_skipped]
        return exposition([(policy.LOG_TARGET, own), ("process", process_samples())]).encode()

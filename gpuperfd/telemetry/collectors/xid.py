"""XID (critical driver error) counters, fed by the event watcher, not by polling.

NVML reports XIDs as events; the sampler's watcher thread blocks on the event
set and counts every event, so a repeat of the same XID between two scrapes is
counted twice rather than lost.
"""

from __future__ import annotations

import threading
from collections import Counter

from gpuperfd.device.base import Device, XidEvent
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class XidCollector(Collector):
    name = "xid"
    help = "XID critical error events, counted per XID code"
    event_driven = True
    metrics = (
        MetricSpec(
            "gpuperf_xid_errors_total",
            "XID critical error events since the daemon started, by XID code.",
            kind="counter",
            labels=("xid",),
        ),
        MetricSpec(
            "gpuperf_xid_events_total",
            "XID critical error events of any code since the daemon started (present from 0).",
            kind="counter",
        ),
    )

    def read(self, device: Device) -> list[Point]:
        raise NotImplementedError("xid is event-driven: see XidCounts")


class XidCounts:
    """Thread-safe per-GPU, per-code event counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, Counter[int]] = {}

    def add(self, event: XidEvent) -> None:
        with self._lock:
            self._counts.setdefault(event.gpu_index, Counter())[event.xid] += 1

    def points(self, gpu_index: int) -> list[Point]:
        with self._lock:
            counts = dict(self._counts.get(gpu_index, {}))
        points = [Point("gpuperf_xid_errors_total", n, (str(xid),)) for xid, n in sorted(counts.items())]
        points.append(Point("gpuperf_xid_events_total", sum(counts.values())))
        return points

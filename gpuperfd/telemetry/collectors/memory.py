"""Device memory in use and in total."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class MemoryCollector(Collector):
    name = "memory"
    help = "Device memory used and total"
    metrics = (
        MetricSpec("gpuperf_memory_used_bytes", "Device memory in use, bytes."),
        MetricSpec("gpuperf_memory_total_bytes", "Device memory in total, bytes."),
    )

    def read(self, device: Device) -> list[Point]:
        mem = device.memory()
        return [
            Point("gpuperf_memory_used_bytes", mem.used_bytes),
            Point("gpuperf_memory_total_bytes", mem.total_bytes),
        ]

"""Compute processes running on the GPU (count and their memory)."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class ProcessesCollector(Collector):
    name = "processes"
    help = "Number of compute processes and the memory they hold"
    metrics = (
        MetricSpec("gpuperf_compute_processes", "Compute processes running on the GPU."),
        MetricSpec("gpuperf_compute_processes_memory_bytes", "Device memory held by compute processes, bytes (where reported)."),
    )

    def read(self, device: Device) -> list[Point]:
        processes = device.compute_processes()
        used = [p.used_memory_bytes for p in processes if p.used_memory_bytes is not None]
        return [
            Point("gpuperf_compute_processes", len(processes)),
            Point("gpuperf_compute_processes_memory_bytes", sum(used)),
        ]

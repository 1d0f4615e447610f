"""GPU and memory-controller utilization (cheap NVML call)."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class UtilizationCollector(Collector):
    name = "utilization"
    help = "Share of time the SMs and the memory controller were busy"
    metrics = (
        MetricSpec("gpuperf_gpu_utilization_ratio", "Share of the last driver sample period a kernel was running (0-1)."),
        MetricSpec("gpuperf_memory_utilization_ratio", "Share of the last driver sample period device memory was read or written (0-1)."),
    )

    def read(self, device: Device) -> list[Point]:
        util = device.utilization()
        return [
            Point("gpuperf_gpu_utilization_ratio", util.gpu_ratio),
            Point("gpuperf_memory_utilization_ratio", util.memory_ratio),
        ]

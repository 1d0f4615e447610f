"""GPU and memory-controller utilization (cheap NVML call)."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Field, FieldsCollector, register


@register
class UtilizationCollector(FieldsCollector):
    name = "utilization"
    help = "Share of time the SMs and the memory controller were busy"
    fields = (
        Field("gpuperf_gpu_utilization_ratio", "gpu_ratio",
              "Share of the last driver sample period a kernel was running (0-1)."),
        Field("gpuperf_memory_utilization_ratio", "memory_ratio",
              "Share of the last driver sample period device memory was read or written (0-1)."),
    )

    def reading(self, device: Device) -> object:
        return device.utilization()

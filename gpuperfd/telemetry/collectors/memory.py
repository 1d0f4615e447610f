"""Device memory in use and in total."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Field, FieldsCollector, register


@register
class MemoryCollector(FieldsCollector):
    name = "memory"
    help = "Device memory used and total"
    fields = (
        Field("gpuperf_memory_used_bytes", "used_bytes", "Device memory in use, bytes."),
        Field("gpuperf_memory_total_bytes", "total_bytes", "Device memory in total, bytes."),
    )

    def reading(self, device: Device) -> object:
        return device.memory()

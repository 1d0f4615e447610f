"""SM and memory clocks, current and maximum (a maximum the GPU does not report is left out)."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Field, FieldsCollector, register


@register
class ClocksCollector(FieldsCollector):
    name = "clocks"
    help = "SM and memory clocks, current and maximum"
    fields = (
        Field("gpuperf_sm_clock_hertz", "sm_hertz", "Current SM clock, hertz."),
        Field("gpuperf_memory_clock_hertz", "memory_hertz", "Current memory clock, hertz."),
        Field("gpuperf_sm_clock_max_hertz", "sm_max_hertz", "Maximum SM clock, hertz."),
        Field("gpuperf_memory_clock_max_hertz", "memory_max_hertz", "Maximum memory clock, hertz."),
    )

    def reading(self, device: Device) -> object:
        return device.clocks()

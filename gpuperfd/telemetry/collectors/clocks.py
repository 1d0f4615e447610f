"""SM and memory clocks, current and maximum."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class ClocksCollector(Collector):
    name = "clocks"
    help = "SM and memory clocks, current and maximum"
    metrics = (
        MetricSpec("gpuperf_sm_clock_hertz", "Current SM clock, hertz."),
        MetricSpec("gpuperf_memory_clock_hertz", "Current memory clock, hertz."),
        MetricSpec("gpuperf_sm_clock_max_hertz", "Maximum SM clock, hertz."),
        MetricSpec("gpuperf_memory_clock_max_hertz", "Maximum memory clock, hertz."),
    )

    def read(self, device: Device) -> list[Point]:
        clocks = device.clocks()
        points = [
            Point("gpuperf_sm_clock_hertz", clocks.sm_hertz),
            Point("gpuperf_memory_clock_hertz", clocks.memory_hertz),
        ]
        if clocks.sm_max_hertz is not None:
            points.append(Point("gpuperf_sm_clock_max_hertz", clocks.sm_max_hertz))
        if clocks.memory_max_hertz is not None:
            points.append(Point("gpuperf_memory_clock_max_hertz", clocks.memory_max_hertz))
        return points

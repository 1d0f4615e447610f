"""The hardware energy counter (slow: ~3 ms per NVML call on an H200)."""

from __future__ import annotations

from gpuperfd.collectors.base import Collector, MetricSpec, Point, register
from gpuperfd.device.base import Device


@register
class EnergyCollector(Collector):
    name = "energy"
    help = "Total energy consumed since the driver loaded (hardware counter)"
    slow = True
    default_interval_seconds = 1.0
    metrics = (
        MetricSpec(
            "gpuperf_energy_joules_total",
            "Energy consumed since the driver loaded, joules (hardware counter).",
            kind="counter",
        ),
    )

    def read(self, device: Device) -> list[Point]:
        return [Point("gpuperf_energy_joules_total", device.energy_joules())]

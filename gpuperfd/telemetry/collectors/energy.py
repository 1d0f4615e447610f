"""The hardware energy counter (slow: ~3 ms of CPU per NVML call on an H200).

Read every 5 s by default: fresher than any usual scrape interval, at a tenth
of a percent of a core per GPU (1 s would cost ~0.4%); configurable per node
with ``sampler.collectors.energy.interval_seconds``.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class EnergyCollector(Collector):
    name = "energy"
    help = "Total energy consumed since the driver loaded (hardware counter)"
    slow = True
    default_interval_seconds = 5.0
    metrics = (
        MetricSpec(
            "gpuperf_energy_joules_total",
            "Energy consumed since the driver loaded, joules (hardware counter).",
            kind="counter",
        ),
    )

    def read(self, device: Device) -> list[Point]:
        return [Point("gpuperf_energy_joules_total", device.energy_joules())]

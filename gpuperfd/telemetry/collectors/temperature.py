"""GPU die temperature."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class TemperatureCollector(Collector):
    name = "temperature"
    help = "GPU die temperature"
    metrics = (MetricSpec("gpuperf_temperature_celsius", "GPU die temperature, degrees Celsius."),)

    def read(self, device: Device) -> list[Point]:
        return [Point("gpuperf_temperature_celsius", device.temperature_celsius())]

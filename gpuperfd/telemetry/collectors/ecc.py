"""ECC error counters (volatile: since the driver loaded)."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class EccCollector(Collector):
    name = "ecc"
    help = "Corrected and uncorrected ECC errors since the driver loaded"
    metrics = (
        MetricSpec(
            "gpuperf_ecc_errors_total",
            "ECC errors since the driver loaded, by type (corrected, uncorrected).",
            kind="counter",
            labels=("type",),
        ),
    )

    def read(self, device: Device) -> list[Point]:
        ecc = device.ecc_errors()
        return [
            Point("gpuperf_ecc_errors_total", ecc.corrected_total, ("corrected",)),
            Point("gpuperf_ecc_errors_total", ecc.uncorrected_total, ("uncorrected",)),
        ]

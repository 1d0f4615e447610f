"""Identity of each GPU as an _info series (value 1, identity in labels)."""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register

INFO_LABELS = ("name", "pci_bus_id", "driver_version", "compute_capability", "backend")


@register
class InfoCollector(Collector):
    name = "info"
    help = "GPU identity: name, PCI bus id, driver, compute capability, backend"
    metrics = (
        MetricSpec(
            "gpuperf_gpu_info",
            "GPU identity; join on gpu/uuid to add a model name to other series.",
            labels=INFO_LABELS,
        ),
    )

    def read(self, device: Device) -> list[Point]:
        info = device.info()
        return [
            Point(
                "gpuperf_gpu_info",
                1.0,
                (info.name, info.pci_bus_id, info.driver_version, info.compute_capability, info.backend),
            )
        ]

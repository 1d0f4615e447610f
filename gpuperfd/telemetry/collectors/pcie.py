"""PCIe throughput (slow: NVML samples a 20 ms window per direction, ~42 ms a read).

Read every 30 s by default: the value is a 20 ms snapshot, not an average, so
reading it more often adds cost without adding truth.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class PcieCollector(Collector):
    name = "pcie"
    help = "PCIe transmit and receive throughput"
    slow = True
    default_interval_seconds = 30.0
    metrics = (
        MetricSpec("gpuperf_pcie_tx_bytes_per_second", "PCIe transmit throughput over the driver's 20 ms window, bytes per second."),
        MetricSpec("gpuperf_pcie_rx_bytes_per_second", "PCIe receive throughput over the driver's 20 ms window, bytes per second."),
    )

    def read(self, device: Device) -> list[Point]:
        pcie = device.pcie_throughput()
        return [
            Point("gpuperf_pcie_tx_bytes_per_second", pcie.tx_bytes_per_second),
            Point("gpuperf_pcie_rx_bytes_per_second", pcie.rx_bytes_per_second),
        ]

"""PCIe throughput and link state (slow: NVML samples a 20 ms window per direction, ~42 ms a read).

Read every 30 s by default: the value is a 20 ms snapshot, not an average, so
reading it more often adds cost without adding truth.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Field, FieldsCollector, register


@register
class PcieCollector(FieldsCollector):
    name = "pcie"
    help = "PCIe transmit and receive throughput"
    slow = True
    default_interval_seconds = 30.0
    fields = (
        Field("gpuperf_pcie_tx_bytes_per_second", "tx_bytes_per_second",
              "PCIe transmit throughput over the driver's 20 ms window, bytes per second."),
        Field("gpuperf_pcie_rx_bytes_per_second", "rx_bytes_per_second",
              "PCIe receive throughput over the driver's 20 ms window, bytes per second."),
    )

    def reading(self, device: Device) -> object:
        return device.pcie_throughput()


@register
class PcieLinkCollector(FieldsCollector):
    """Link generation and width, current and maximum: a link trained below its maximum while
    busy is a hardware problem (riser, connector, slot) the health checks report.

    Fast lane, every sampling interval: the four getters cost 1.7-1.8 us each and the current
    width 33 us on an H100 (benchmarks/pcie_link_idle_busy.py), and a board that trains its link
    down at idle must be read during a busy streak for the checks to count it: every 10 s, a
    probe of a few seconds was never seen at all."""

    name = "pcie_link"
    help = "PCIe link generation and width, current and maximum"
    fields = (
        Field("gpuperf_pcie_link_generation", "generation", "PCIe link generation the link trained at now (drops at idle)."),
        Field("gpuperf_pcie_link_width", "width", "PCIe link width (lanes) the link trained at now."),
        Field("gpuperf_pcie_link_max_generation", "max_generation", "Highest PCIe generation the GPU and its slot support."),
        Field("gpuperf_pcie_link_max_width", "max_width", "Widest PCIe link (lanes) the GPU and its slot support."),
    )

    def reading(self, device: Device) -> object:
        return device.pcie_link()

"""NVLink: per-link state, error counters by type (summed over links), data bytes.

Errors are summed over links to keep the series per GPU bounded (5, not 5 per link);
the per-link state says which link is down. Absent on GPUs without NVLink (PCIe
cards, most VMs). Slow lane, every 30 s: a read is ~100 NVML calls on an 18-link part.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class NvLinkCollector(Collector):
    name = "nvlink"
    help = "NVLink per-link state, error counters and data bytes"
    slow = True
    default_interval_seconds = 30.0
    metrics = (
        MetricSpec("gpuperf_nvlink_up", "1 when the NVLink link is active.", labels=("link",)),
        MetricSpec(
            "gpuperf_nvlink_errors_total",
            "NVLink errors over all links, by type (replay, recovery, crc_flit, crc_data, ecc_data).",
            kind="counter",
            labels=("type",),
        ),
        MetricSpec("gpuperf_nvlink_tx_bytes_total", "Data bytes sent over all NVLink links.", kind="counter"),
        MetricSpec("gpuperf_nvlink_rx_bytes_total", "Data bytes received over all NVLink links.", kind="counter"),
    )

    def read(self, device: Device) -> list[Point]:
        status = device.nvlink()
        points = [Point("gpuperf_nvlink_up", float(up), (str(link),)) for link, up in status.links]
        points += [Point("gpuperf_nvlink_errors_total", count, (kind,)) for kind, count in status.errors.items()]
        if status.tx_bytes_total is not None:
            points.append(Point("gpuperf_nvlink_tx_bytes_total", status.tx_bytes_total))
        if status.rx_bytes_total is not None:
            points.append(Point("gpuperf_nvlink_rx_bytes_total", status.rx_bytes_total))
        return points

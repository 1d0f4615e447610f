"""Memory health: HBM temperature, row remapping, retired pages, PCIe replays.

What decides whether a GPU needs a reset or service, beside the ECC counters:
a pending row remap takes effect only after a GPU reset; a failed remap means the
part has run out of spare rows; rising PCIe replays mean a marginal link.
Each field the GPU lacks (retired pages on Hopper) is left out. Slow lane: the
field-value read (~1.1 ms) and the remap query (~1 ms) cost more than the cheap getters.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.device.errors import NotSupported
from gpuperfd.telemetry.collectors.base import (
    Collector,
    MetricSpec,
    Point,
    optional,
    register,
)


@register
class HealthCollector(Collector):
    name = "health"
    help = "HBM temperature, remapped rows, retired pages, PCIe replays"
    slow = True
    default_interval_seconds = 10.0
    metrics = (
        MetricSpec("gpuperf_memory_temperature_celsius", "HBM (memory) temperature, degrees Celsius."),
        MetricSpec(
            "gpuperf_remapped_rows",
            "Rows remapped since manufacture, by the error that caused it (correctable, uncorrectable).",
            labels=("cause",),
        ),
        MetricSpec("gpuperf_remapped_rows_pending", "1 when a row remap waits for a GPU reset to take effect."),
        MetricSpec("gpuperf_remapped_rows_failure", "1 when a row remap failed: the GPU needs service."),
        MetricSpec(
            "gpuperf_retired_pages",
            "Pages retired, by cause (multiple_single_bit_ecc, double_bit_ecc); pre-Ampere GPUs.",
            labels=("cause",),
        ),
        MetricSpec("gpuperf_pcie_replays_total", "PCIe link-level replays since the driver loaded.", kind="counter"),
        MetricSpec("gpuperf_gpu_recovery_action", "The driver's GPU recovery action: 0 none, 1 GPU reset, "
                   "2 node reboot, 3 drain P2P, 4 drain and reset (NVML field 230)."),
    )

    def read(self, device: Device) -> list[Point]:
        points: list[Point] = []
        temperature = optional(device.memory_temperature_celsius)
        if temperature is not None:
            points.append(Point("gpuperf_memory_temperature_celsius", temperature))
        rows = optional(device.remapped_rows)
        if rows is not None:
            points += [
                Point("gpuperf_remapped_rows", rows.correctable, ("correctable",)),
                Point("gpuperf_remapped_rows", rows.uncorrectable, ("uncorrectable",)),
                Point("gpuperf_remapped_rows_pending", float(rows.pending)),
                Point("gpuperf_remapped_rows_failure", float(rows.failure)),
            ]
        pages = optional(device.retired_pages)
        if pages is not None:
            points += [
                Point("gpuperf_retired_pages", pages.multiple_single_bit_ecc, ("multiple_single_bit_ecc",)),
                Point("gpuperf_retired_pages", pages.double_bit_ecc, ("double_bit_ecc",)),
            ]
        replays = optional(device.pcie_replays)
        if replays is not None:
            points.append(Point("gpuperf_pcie_replays_total", replays))
        recovery = optional(device.gpu_recovery_action)
        if recovery is not None:
            points.append(Point("gpuperf_gpu_recovery_action", recovery))
        if not points:
            raise NotSupported("no memory-health field is supported")
        return points

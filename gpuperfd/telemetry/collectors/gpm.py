"""GPM profiling metrics (Hopper and newer): how busy the SMs, tensor pipes and DRAM really are.

These are the numbers operators keep dcgm-exporter's profiling fields for
(DCGM_FI_PROF_*), read from NVML's GPM without the DCGM host engine. GPM needs two
samples; the device keeps one per GPU between rounds, so each read publishes the
rates over the interval since the previous read. Slow lane: a sample costs
~0.7 ms and the metrics ~4 ms on an H200. Absent (never NaN) on GPUs without GPM.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register

#: GPM field key -> (metric, label values). One table, one loop.
GPM_SERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sm_active": ("gpuperf_gpm_sm_active_ratio", ()),
    "sm_occupancy": ("gpuperf_gpm_sm_occupancy_ratio", ()),
    "tensor_any": ("gpuperf_gpm_tensor_active_ratio", ("any",)),
    "tensor_hmma": ("gpuperf_gpm_tensor_active_ratio", ("hmma",)),
    "tensor_imma": ("gpuperf_gpm_tensor_active_ratio", ("imma",)),
    "tensor_dfma": ("gpuperf_gpm_tensor_active_ratio", ("dfma",)),
    "dram_active": ("gpuperf_gpm_dram_bandwidth_active_ratio", ()),
    "fp16": ("gpuperf_gpm_pipe_active_ratio", ("fp16",)),
    "fp32": ("gpuperf_gpm_pipe_active_ratio", ("fp32",)),
    "fp64": ("gpuperf_gpm_pipe_active_ratio", ("fp64",)),
    "pcie_tx_bytes_per_second": ("gpuperf_gpm_pcie_tx_bytes_per_second", ()),
    "pcie_rx_bytes_per_second": ("gpuperf_gpm_pcie_rx_bytes_per_second", ()),
    "nvlink_tx_bytes_per_second": ("gpuperf_gpm_nvlink_tx_bytes_per_second", ()),
    "nvlink_rx_bytes_per_second": ("gpuperf_gpm_nvlink_rx_bytes_per_second", ()),
}


@register
class GpmCollector(Collector):
    name = "gpm"
    help = "GPM profiling: SM active/occupancy, tensor and FP pipe activity, DRAM bandwidth, PCIe/NVLink bytes"
    slow = True
    default_interval_seconds = 10.0
    metrics = (
        MetricSpec("gpuperf_gpm_sm_active_ratio", "Share of SMs with a warp resident, mean over the GPM interval (0-1)."),
        MetricSpec("gpuperf_gpm_sm_occupancy_ratio", "Resident warps over the maximum, mean over the GPM interval (0-1)."),
        MetricSpec(
            "gpuperf_gpm_tensor_active_ratio",
            "Share of cycles the tensor pipes were busy, by precision (any; hmma: fp16/bf16/tf32/fp8; imma: integer; dfma: fp64).",
            labels=("precision",),
        ),
        MetricSpec("gpuperf_gpm_dram_bandwidth_active_ratio", "DRAM bandwidth used over the peak, mean over the GPM interval (0-1)."),
        MetricSpec("gpuperf_gpm_pipe_active_ratio", "Share of cycles the non-tensor FP pipe was busy, by pipe (fp16, fp32, fp64).", labels=("pipe",)),
        MetricSpec("gpuperf_gpm_pcie_tx_bytes_per_second", "PCIe bytes sent per second over the GPM interval."),
        MetricSpec("gpuperf_gpm_pcie_rx_bytes_per_second", "PCIe bytes received per second over the GPM interval."),
        MetricSpec("gpuperf_gpm_nvlink_tx_bytes_per_second", "NVLink bytes sent per second over all links, GPM interval."),
        MetricSpec("gpuperf_gpm_nvlink_rx_bytes_per_second", "NVLink bytes received per second over all links, GPM interval."),
    )

    def read(self, device: Device) -> list[Point]:
        values = device.gpm_metrics().values
        return [Point(metric, values[key], labels) for key, (metric, labels) in GPM_SERIES.items() if key in values]

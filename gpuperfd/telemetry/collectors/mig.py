"""MIG: whether MIG mode is on, and per-instance memory and GPM activity.

With MIG on, the whole-GPU utilization says little: each instance is its own
tenant. Series are labelled by GPU instance and compute instance ids (at most 7
instances on Hopper, so bounded). GPM per instance is read for its GPU instance.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import (
    Collector,
    MetricSpec,
    Point,
    optional,
    register,
)

_INSTANCE = ("gpu_instance", "compute_instance")
#: GPM field key -> per-instance metric.
MIG_GPM_SERIES: dict[str, str] = {
    "sm_active": "gpuperf_mig_gpm_sm_active_ratio",
    "tensor_any": "gpuperf_mig_gpm_tensor_active_ratio",
    "dram_active": "gpuperf_mig_gpm_dram_bandwidth_active_ratio",
}


@register
class MigCollector(Collector):
    name = "mig"
    help = "MIG mode and per-instance memory and GPM activity"
    slow = True
    default_interval_seconds = 10.0
    metrics = (
        MetricSpec("gpuperf_mig_enabled", "1 when MIG mode is on."),
        MetricSpec("gpuperf_mig_memory_used_bytes", "Device memory used in the MIG instance.", labels=_INSTANCE),
        MetricSpec("gpuperf_mig_memory_total_bytes", "Device memory of the MIG instance.", labels=_INSTANCE),
        MetricSpec("gpuperf_mig_gpm_sm_active_ratio", "SM active ratio of the instance's GPU instance (GPM).", labels=_INSTANCE),
        MetricSpec("gpuperf_mig_gpm_tensor_active_ratio", "Tensor active ratio of the instance's GPU instance (GPM).", labels=_INSTANCE),
        MetricSpec(
            "gpuperf_mig_gpm_dram_bandwidth_active_ratio",
            "DRAM bandwidth active ratio of the instance's GPU instance (GPM).",
            labels=_INSTANCE,
        ),
    )

    def read(self, device: Device) -> list[Point]:
        enabled = device.mig_enabled()
        points = [Point("gpuperf_mig_enabled", float(enabled))]
        if not enabled:
            return points
        for instance in optional(device.mig_instances) or []:
            ids = (str(instance.gpu_instance), str(instance.compute_instance))
            if instance.memory_used_bytes is not None:
                points.append(Point("gpuperf_mig_memory_used_bytes", instance.memory_used_bytes, ids))
            if instance.memory_total_bytes is not None:
                points.append(Point("gpuperf_mig_memory_total_bytes", instance.memory_total_bytes, ids))
            values = instance.gpm.values if instance.gpm is not None else {}
            points += [Point(metric, values[key], ids) for key, metric in MIG_GPM_SERIES.items() if key in values]
        return points

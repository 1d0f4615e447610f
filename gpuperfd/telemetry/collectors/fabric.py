"""GPU fabric: the NVSwitch fabric's state per GPU, as the Fabric Manager left it (issue 44).

DCGM called every GPU of a cluster healthy while its Fabric Manager was down for 20 days
(NVSentinel #883): a GPU whose fabric has not started, is still starting, or completed with an
error cannot use its NVLinks through the switches. This collector reads
``Device.fabric_state()`` (nvmlDeviceGetGpuFabricInfoV) into a one-hot state series and a status
flag, which the fabric checks of docs/health.md judge. Absent on a board without an NVSwitch fabric
(a PCIe card, a 2-GPU NVLink pair): such a board is never judged by a fabric rule. Slow lane, 30 s.
"""

from __future__ import annotations

from gpuperfd.device.base import FABRIC_STATES, Device
from gpuperfd.device.errors import NotSupported
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register

#: The states a fabric that exists can be in (the label values of gpuperf_fabric_state).
STATES: tuple[str, ...] = tuple(state for state in FABRIC_STATES if state != "not_supported")


@register
class FabricCollector(Collector):
    name = "fabric"
    help = "GPU fabric (NVSwitch, Fabric Manager) state and status"
    slow = True
    default_interval_seconds = 30.0
    metrics = (
        MetricSpec("gpuperf_fabric_state",
                   "1 for the GPU fabric's current state (not_started, in_progress, completed), 0 for the others; "
                   "absent without an NVSwitch fabric.", labels=("state",)),
        MetricSpec("gpuperf_fabric_status_ok",
                   "1 when the fabric completed with success, 0 when it completed with an error (present once completed)."),
    )

    def read(self, device: Device) -> list[Point]:
        fabric = device.fabric_state()
        if fabric.state not in STATES:
            raise NotSupported(f"GPU {device.index}: fabric state {fabric.state}")
        points = [Point("gpuperf_fabric_state", float(fabric.state == state), (state,)) for state in STATES]
        if fabric.state == "completed":
            points.append(Point("gpuperf_fabric_status_ok", float(fabric.status is None)))
        return points

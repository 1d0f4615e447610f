"""Violation time: how long the clock was held back, by reason, as counters.

The clock-event gauge says whether a reason is active at the instant it is read
(once a second); these counters integrate it in the driver, so
``rate(gpuperf_violation_seconds_total[5m])`` is the share of time the GPU was held
back by power, thermal or other policy, with nothing missed between reads.
"""

from __future__ import annotations

from gpuperfd.device.base import Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class ViolationsCollector(Collector):
    name = "violations"
    help = "Seconds the clock was held back by power, thermal, sync boost, board limit, low utilization, reliability"
    slow = True
    default_interval_seconds = 10.0
    metrics = (
        MetricSpec(
            "gpuperf_violation_seconds_total",
            "Seconds the GPU clock was held back since the driver loaded, by reason "
            "(power, thermal, sync_boost, board_limit, low_utilization, reliability).",
            kind="counter",
            labels=("reason",),
        ),
    )

    def read(self, device: Device) -> list[Point]:
        return [
            Point("gpuperf_violation_seconds_total", seconds, (reason,))
            for reason, seconds in device.violation_seconds().items()
        ]

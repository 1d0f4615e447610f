"""Power draw and the power limit with its allowed range."""

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
class PowerCollector(Collector):
    name = "power"
    help = "Power draw, enforced power limit, its default and its min/max"
    reads_power_cap = True
    metrics = (
        MetricSpec("gpuperf_power_draw_watts", "Power draw as averaged by the driver, watts."),
        MetricSpec("gpuperf_power_limit_watts", "Enforced power limit (cap), watts."),
        MetricSpec("gpuperf_power_limit_default_watts", "Default power limit of the board, watts."),
        MetricSpec("gpuperf_power_limit_min_watts", "Lowest power limit the board accepts, watts."),
        MetricSpec("gpuperf_power_limit_max_watts", "Highest power limit the board accepts, watts."),
    )

    def read(self, device: Device) -> list[Point]:
        points: list[Point] = []
        draw = optional(device.power_watts)
        if draw is not None:
            points.append(Point("gpuperf_power_draw_watts", draw))
        limits = optional(device.power_limits)
        if limits is not None:
            points += [
                Point("gpuperf_power_limit_watts", limits.enforced_watts),
                Point("gpuperf_power_limit_default_watts", limits.default_watts),
                Point("gpuperf_power_limit_min_watts", limits.min_watts),
                Point("gpuperf_power_limit_max_watts", limits.max_watts),
            ]
        if not points:
            raise NotSupported("neither power draw nor power limits are supported")
        return points

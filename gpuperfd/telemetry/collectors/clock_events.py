"""Clock-event (throttle) reasons: one 0/1 series per reason, so every reason is visible."""

from __future__ import annotations

from gpuperfd.device.base import CLOCK_EVENT_REASONS, Device
from gpuperfd.telemetry.collectors.base import Collector, MetricSpec, Point, register


@register
class ClockEventsCollector(Collector):
    name = "clock_events"
    help = "Why clocks are held below their maximum (throttle reasons)"
    metrics = (
        MetricSpec(
            "gpuperf_clock_event_active",
            "1 if this clock-event (throttle) reason is active now, else 0.",
            labels=("reason",),
        ),
    )

    def read(self, device: Device) -> list[Point]:
        active = device.clock_events().active
        return [
            Point("gpuperf_clock_event_active", 1.0 if reason in active else 0.0, (reason,))
            for reason in CLOCK_EVENT_REASONS
        ]

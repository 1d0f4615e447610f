"""Where the YAML schedule meets the probing side: a schedule becomes a plain request, once.

``ScheduleConfig`` (config/) says when and how a probe runs; everything below the daemon's round
(the owned sweep, the sessions, the executors) takes a :class:`~gpuperfd.probe_data.request.ProbeRequest`
and the caps to sweep, a :class:`~gpuperfd.probing.sweep.owned.PlannedProbe`, never the configuration
model. The CLIs build the same two from their flags.
"""

from __future__ import annotations

from gpuperfd.config import ScheduleConfig
from gpuperfd.probe_data.request import ProbeRequest
from gpuperfd.probing.sweep.owned import PlannedProbe

__all__ = ["request_from_schedule", "planned_from_schedule"]


def request_from_schedule(schedule: ScheduleConfig) -> ProbeRequest:
    """The probe request of a YAML schedule (its probe, preset, options and settle bound)."""
    return ProbeRequest(probe=schedule.probe, preset=schedule.preset, options=dict(schedule.options),
                        settle_seconds=schedule.settle_seconds)


def planned_from_schedule(schedule: ScheduleConfig) -> PlannedProbe:
    """The schedule as one probe of an owned sweep: its request and caps; the schedule rides along as
    the origin, so the daemon's round publishes each sweep under the schedule that asked for it."""
    return PlannedProbe(request_from_schedule(schedule), tuple(schedule.caps), origin=schedule)

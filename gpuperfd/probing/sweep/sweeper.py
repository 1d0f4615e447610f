"""A power-cap sweep: run one probe at each cap on one GPU, then restore the original cap.

The sweep never imports torch or pynvml: it gets a device and a function that
runs the probe once and returns a ProbeResult. In read-only mode it runs the
probe once at the current cap and never touches the limit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuperfd.device.base import Device
from gpuperfd.probes.result import ProbeResult
from gpuperfd.probing.sweep.caps import CapGuard
from gpuperfd.probing.sweep.journal import CapJournal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepPoint:
    cap_watts: float
    result: ProbeResult


@dataclass(frozen=True)
class Recommendation:
    """The cap with the lowest energy per unit among caps within ``max_slowdown`` of the fastest cap."""

    cap_watts: float
    baseline_cap_watts: float
    energy_saving_ratio: float
    slowdown_ratio: float
    max_slowdown: float


def work_rate(result: ProbeResult) -> float | None:
    """Units of work per second over the measured window (the probe's primary throughput)."""
    if result.status != "ok" or not result.measured_seconds:
        return None
    return result.units_of_work / result.measured_seconds


def recommend(points: Sequence[SweepPoint], max_slowdown: float = 0.10) -> Recommendation | None:
    """Apply the recommendation rule (the same one the Prometheus recording rules hold).

    The baseline is the highest cap tested. An exact tie in energy per unit goes to
    the lower cap, as in the rules. None when no ok point has energy data.
    """
    usable = [
        (p.cap_watts, work_rate(p.result), p.result.energy_per_unit_joules)
        for p in points
        if work_rate(p.result) and p.result.energy_per_unit_joules
    ]
    if not usable:
        return None
    baseline_cap, baseline_rate, baseline_energy = max(usable, key=lambda u: u[0])
    eligible = [u for u in usable if u[1] >= (1.0 - max_slowdown) * baseline_rate]
    cap, rate, energy = min(eligible, key=lambda u: (u[2], u[0]))  # ties: the lower cap (docs/architecture.md)
    return Recommendation(
        cap_watts=cap,
        baseline_cap_watts=baseline_cap,
        energy_saving_ratio=1.0 - energy / baseline_energy,
        slowdown_ratio=1.0 - rate / baseline_rate,
        max_slowdown=max_slowdown,
    )


class SweepAborted(Exception):
    """The sweep was stopped (daemon shutdown) before every cap ran."""


def run_sweep(
    device: Device,
    journal: CapJournal,
    caps_watts: Sequence[float],
    run_point: Callable[[float], ProbeResult],
    *,
    settle_seconds: float = 5.0,
    read_only: bool = False,
    abort: threading.Event | None = None,
    on_cap: Callable[[float | None], None] | None = None,
    on_point: Callable[[SweepPoint], None] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> list[SweepPoint]:
    """Run ``run_point`` at each cap (highest first); always restore the original cap.

    ``on_cap(watts)`` is told the cap held now (None once restored); ``on_point``
    gets each result as it comes. ``abort`` stops between points, restoring first.
    """
    abort = abort or threading.Event()
    wait = sleep or (lambda seconds: abort.wait(seconds))
    points: list[SweepPoint] = []
    if read_only:
        current = device.power_limits().enforced_watts
        log.info("gpu %d: read-only mode, probing at the current cap %.0f W only", device.index, current)
        point = SweepPoint(current, run_point(current))
        if on_point:
            on_point(point)
        return [point]
    try:
        with CapGuard(device, journal) as guard:
            for cap in caps_watts:
                if abort.is_set():
                    raise SweepAborted(f"sweep on gpu {device.index} aborted before {cap:.0f} W")
                guard.set(cap)
                if on_cap:
                    on_cap(cap)
                wait(settle_seconds)
                if abort.is_set():
                    raise SweepAborted(f"sweep on gpu {device.index} aborted at {cap:.0f} W")
                started = time.monotonic()
                point = SweepPoint(cap, run_point(cap))
                log.info(
                    "gpu %d: %s at %.0f W: %s in %.1f s",
                    device.index, point.result.probe, cap, point.result.status, time.monotonic() - started,
                )
                points.append(point)
                if on_point:
                    on_point(point)
                if point.result.status == "aborted":  # someone else wants the GPU: give it back now
                    log.warning("gpu %d: sweep stopped: %s", device.index, point.result.error_message)
                    break
    finally:
        if on_cap:
            on_cap(None)
    return points

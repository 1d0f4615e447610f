"""A power-cap sweep: run one probe at each cap on one GPU, then restore the original cap.

The sweep never imports torch or pynvml: it gets a device and a function that
measures the probe once at the cap set now (a warm child's next point, see
:mod:`gpuperfd.probing.executors`) and returns a ProbeResult. In read-only mode it
runs the probe once at the current cap and never touches the limit.

Per cap: journal (first change only), set, read the limit back (bounded by
``settle_seconds``), measure; the measurement itself waits for steady power and SM
clock under load (:mod:`gpuperfd.probes.settle`). With ``stop_early`` the caps below
one that is clearly slower than ``max_slowdown`` allows are skipped (status
``skipped``, reason ``early_stop``): throughput does not rise as the cap falls, so
none of them could be recommended.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuperfd.device.base import Device
from gpuperfd.probes.result import ProbeResult, describe
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


#: A result without repeats (or one) is given this relative noise for the early-stop margin.
DEFAULT_RATE_NOISE = 0.01
#: How many standard deviations of the two points' combined noise "clearly" means.
EARLY_STOP_SIGMAS = 3.0


def rate_noise(result: ProbeResult) -> float:
    """Relative spread (CV) of the work rate over the result's measured windows."""
    rates = [r.units_of_work / r.measured_seconds for r in result.repeats if r.measured_seconds > 0]
    stats = describe(rates)
    if stats is None or stats.n < 2 or stats.cv is None:
        return DEFAULT_RATE_NOISE
    return stats.cv


def read_only_note(caps_watts: Sequence[float], current_watts: float) -> str:
    """What a run that changes no cap measured, in words (the sweep CLI and the daemon's log).

    A one-cap schedule whose cap is the current one is not "read-only mode"; asked-for caps that
    were not measured are named, never dropped silently (``--read-only --caps current,max``).
    """
    others = sorted({round(c) for c in caps_watts} - {round(current_watts)}, reverse=True)
    if not others:
        return f"one cap, the current {current_watts:.0f} W: measured without changing the cap"
    listed = ", ".join(f"{c} W" for c in others)
    return (f"read-only: measured the current cap {current_watts:.0f} W only; {listed} not measured "
            "(changing a cap needs read_only: false, or no --read-only)")


def comparison_words(rec: Recommendation, unit: str = "unit") -> str:
    """The recommendation against its baseline in words, for pages and logs.

    ``"25.0% less energy per token, 5.0% slower than 700 W"``; a recommended cap that is the
    baseline itself says so (not "0.0% less energy, 0.0% slower than 700 W"), and a cap that
    measured faster than the baseline says "faster" (not "-0.9% slower").
    """
    if round(rec.cap_watts) == round(rec.baseline_cap_watts):
        return f"the highest cap tested; no lower cap saves energy per {unit} within the allowed slowdown"
    slowdown = 100 * rec.slowdown_ratio
    if abs(slowdown) < 0.05:
        speed = "as fast as"
    else:
        speed = f"{abs(slowdown):.1f}% {'slower' if slowdown > 0 else 'faster'} than"
    return f"{100 * rec.energy_saving_ratio:.1f}% less energy per {unit}, {speed} {rec.baseline_cap_watts:.0f} W"


def clearly_slower(baseline: ProbeResult, point: ProbeResult, max_slowdown: float) -> bool:
    """True when ``point`` is slower than ``baseline`` by more than ``max_slowdown`` plus three
    standard deviations of the two measurements' noise: no lower cap can be recommended then."""
    base, rate = work_rate(baseline), work_rate(point)
    if not base or rate is None:
        return False
    margin = EARLY_STOP_SIGMAS * math.hypot(rate_noise(baseline), rate_noise(point))
    return 1.0 - rate / base > max_slowdown + margin


def skipped_point(cap: float, like: ProbeResult, why: str) -> SweepPoint:
    """A point not run on purpose (reported as skipped, never as failed)."""
    result = ProbeResult.failure(like.probe, like.variant, like.preset, "early_stop", why, status="skipped",
                                 params=dict(like.params), device=like.device, started_at=time.time())
    return SweepPoint(cap, result)


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
    stop_early: float | None = None,
) -> list[SweepPoint]:
    """Run ``run_point`` at each cap (highest first); always restore the original cap.

    ``on_cap(watts)`` is told the cap held now (None once restored); ``on_point``
    gets each result as it comes. ``abort`` stops between points, restoring first.
    ``stop_early``: the recommendation's max_slowdown; caps below the first one that is
    clearly slower than that (see :func:`clearly_slower`) are skipped. None runs every cap.
    """
    abort = abort or threading.Event()
    points: list[SweepPoint] = []
    if read_only:
        current = device.power_limits().enforced_watts
        note = read_only_note(caps_watts, current)
        (log.warning if "not measured" in note else log.info)("gpu %d: %s", device.index, note)
        point = SweepPoint(current, run_point(current))
        if on_point:
            on_point(point)
        return [point]
    stopped_by: SweepPoint | None = None
    try:
        with CapGuard(device, journal) as guard:
            for cap in caps_watts:
                if abort.is_set():
                    raise SweepAborted(f"sweep on gpu {device.index} aborted before {cap:.0f} W")
                if stopped_by is not None:
                    point = skipped_point(cap, stopped_by.result,
                                          f"{stopped_by.cap_watts:.0f} W was already more than "
                                          f"{100 * stop_early:.0f}% slower than {points[0].cap_watts:.0f} W")
                else:
                    guard.set(cap)
                    if on_cap:
                        on_cap(cap)
                    read_back = guard.wait_applied(settle_seconds, abort)
                    if abort.is_set():
                        raise SweepAborted(f"sweep on gpu {device.index} aborted at {cap:.0f} W")
                    started = time.monotonic()
                    point = SweepPoint(cap, run_point(cap))
                    point.result.extra["cap_read_back_seconds"] = read_back
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
                baseline = points[0].result
                if (stop_early is not None and stopped_by is None and len(points) > 1 and baseline.ok
                        and point.result.ok and clearly_slower(baseline, point.result, stop_early)):
                    stopped_by = point
                    log.info("gpu %d: %s at %.0f W is clearly more than %.0f%% slower than at %.0f W: "
                             "lower caps skipped", device.index, point.result.probe, cap, 100 * stop_early,
                             points[0].cap_watts)
    finally:
        if on_cap:
            on_cap(None)
    return points

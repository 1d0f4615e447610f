"""The recommendation rule and the early-stop rule over plain sweep points (no device, no I/O).

Apart from the loop that changes caps (:mod:`gpuperfd.probing.sweep.sweeper`), as Zeus keeps its
power-limit selection apart from the measurement it consumes: the report, the landing page and the
CLI import this without importing anything that can set a power limit. The same rule is held by
the Prometheus recording rules (docs/architecture.md, "Where the recommendation lives").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuperfd.probe_data.result import NO_ROOM, ProbeResult, RepeatResult, describe

__all__ = ["SweepPoint", "Recommendation", "work_rate", "recommend", "rate_cv", "rate_noise", "clearly_slower",
           "MIN_CAPS", "candidates", "recommend_latest", "watts_saved_while_busy",
           "DEFAULT_RATE_NOISE", "EARLY_STOP_SIGMAS", "read_only_note", "unmeasured_caps", "comparison_words",
           "point_words", "cut_short"]


@dataclass(frozen=True)
class SweepPoint:
    """One cap of a sweep and what the probe measured there."""

    cap_watts: float
    result: ProbeResult
    #: The sweep that measured it (None: a lone probe run, or a source that does not say).
    sweep_id: str | None = None
    #: Its sweep was cut short after it (a later point aborted or gave way): no candidate (:func:`candidates`).
    sweep_cut_short: bool = False


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


def point_words(result: ProbeResult) -> str:
    """A finished point in a few words, for the one line per point of ``probe`` and ``sweep`` when
    stderr is not a terminal: ``ok 1234 token/s`` or ``failed (timeout)``."""
    if result.status != "ok":
        return f"{result.status} ({result.failure_reason or 'no reason given'})"
    rate = work_rate(result)
    if rate is None:
        return "ok"
    shown = f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"
    return f"ok {shown} {result.work_unit or 'unit'}/s"


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


#: Measured caps a surface needs before it recommends one: a single cap is only its own baseline.
MIN_CAPS = 2


def _stops_sweep(result: ProbeResult) -> bool:
    """A point that cuts its sweep short: stopped (a shutdown, a signal) or given way to a user's job."""
    return result.status == "aborted" or result.preempted


def candidates(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The recommendation's input, one rule for every surface (the landing page, ``top`` and
    ``/api/v1/gpus``, ``gpuperfd report``, apply mode; the recording rules read the same from the probe
    series), highest cap first:

    * **how fresh, how pooled**: the latest point at each cap, in time order, as the daemon's probe
      series hold it; nothing is averaged across sweeps (a pooled mean mixes conditions a later sweep
      no longer has, and the series cannot hold it). An ok point sets its cap; a failed or early-stopped
      point withdraws the cap's earlier ok one; a point that gave way to a user's job measured nothing
      and leaves it;
    * **which sweeps**: one cut short (a point aborted, or preempted) holds the caps it reached but no
      recommendation stands while any of its points is among the latest: the CLI that ran it said "no
      recommendation", and its lower caps were never measured. None is given until a complete sweep
      replaces them (the empty list);
    * **the edge** is the edge: a cap within ``max_slowdown`` of the highest cap's rate is eligible,
      exactly at it included (:func:`recommend`; the recording rules compare the same way).
    """
    cut = {p.sweep_id for p in points if p.sweep_id and (p.sweep_cut_short or _stops_sweep(p.result))}
    latest: dict[int, SweepPoint] = {}
    for point in sorted(points, key=lambda p: p.result.started_at or 0.0):
        cap, result = round(point.cap_watts), point.result
        if result.status == "ok" and work_rate(result) and result.energy_per_unit_joules:
            latest[cap] = point
        elif not result.preempted:
            latest.pop(cap, None)
    if any(p.sweep_id in cut for p in latest.values()):
        return []
    return sorted(latest.values(), key=lambda p: -p.cap_watts)


def recommend_latest(points: Sequence[SweepPoint], max_slowdown: float = 0.10) -> Recommendation | None:
    """:func:`recommend` on :func:`candidates` of ``points``; None under :data:`MIN_CAPS` caps."""
    usable = candidates(points)
    return recommend(usable, max_slowdown) if len(usable) >= MIN_CAPS else None


def watts_saved_while_busy(points: Sequence[SweepPoint], rec: Recommendation) -> float | None:
    """The probe's mean power at the baseline cap minus at the recommended one (never negative), from
    the same latest points the recommendation used; None where either point has no power."""
    power = {round(p.cap_watts): p.result.average_power_watts for p in candidates(points)}
    base, best = power.get(round(rec.baseline_cap_watts)), power.get(round(rec.cap_watts))
    return None if base is None or best is None else max(0.0, base - best)


def cut_short(points: Sequence[SweepPoint], planned: int) -> str | None:
    """Why a sweep's points support no recommendation, in words, or None when every planned cap has its point.

    A sweep stopped mid-way (a signal, a shutdown: the point being measured comes back ``aborted``)
    has not measured the lower caps; "recommending" the best of what it has would name the highest
    cap with a 0 % saving. Skipped points (early stop) count as done: their caps were ruled out; a
    point that gave way to a user's job (preempted) does not.
    """
    done = sum(1 for p in points if p.result.status != "aborted" and not p.result.preempted)
    if done >= planned:
        return None
    if points and points[-1].result.failure_reason == NO_ROOM:  # not interrupted: no cap makes the memory larger
        return (f"stopped at {points[-1].cap_watts:.0f} W after {done} of {planned} points: the point has no room "
                "on this card (skipped, no_room): no recommendation")
    return f"interrupted after {done} of {planned} points: no recommendation"


#: A result without repeats (or one) is given this relative noise for the early-stop margin.
DEFAULT_RATE_NOISE = 0.01
#: How many standard deviations of the two points' combined noise "clearly" means.
EARLY_STOP_SIGMAS = 3.0


def rate_cv(repeats: Sequence[RepeatResult]) -> float | None:
    """Relative spread (CV) of the work rates of measured windows; None with fewer than two windows
    (or a zero mean), where it cannot be told."""
    rates = [r.units_of_work / r.measured_seconds for r in repeats if r.measured_seconds > 0]
    stats = describe(rates)
    if stats is None or stats.n < 2 or stats.cv is None:
        return None
    return stats.cv


def rate_noise(result: ProbeResult) -> float:
    """Relative spread (CV) of the work rate over the result's measured windows."""
    cv = rate_cv(result.repeats)
    return DEFAULT_RATE_NOISE if cv is None else cv


def clearly_slower(baseline: ProbeResult, point: ProbeResult, max_slowdown: float) -> bool:
    """True when ``point`` is slower than ``baseline`` by more than ``max_slowdown`` plus three
    standard deviations of the two measurements' noise: no lower cap can be recommended then."""
    base, rate = work_rate(baseline), work_rate(point)
    if not base or rate is None:
        return False
    margin = EARLY_STOP_SIGMAS * math.hypot(rate_noise(baseline), rate_noise(point))
    return 1.0 - rate / base > max_slowdown + margin


def unmeasured_caps(caps_watts: Sequence[float], current_watts: float) -> list[int]:
    """The asked-for caps a read-only run leaves unmeasured (all but the current one), highest first."""
    return sorted({round(c) for c in caps_watts} - {round(current_watts)}, reverse=True)


def read_only_note(caps_watts: Sequence[float], current_watts: float) -> str:
    """What a run that changes no cap measured, in words (the sweep CLI and the daemon's log).

    A one-cap schedule whose cap is the current one is not "read-only mode"; asked-for caps that
    were not measured are named, never dropped silently (``--read-only --caps current,max``).
    """
    others = unmeasured_caps(caps_watts, current_watts)
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

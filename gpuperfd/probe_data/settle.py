"""Settle by measurement: after a cap change, wait until power and SM clock are steady.

A new power limit takes effect within milliseconds, but power, clocks and
temperature reach their new operating point over a second or more under load. A
fixed sleep is either too long (GPU time wasted on every point) or too short (the
first window measures the transition). Here the load runs in short slices, and the
point is settled when two consecutive slices agree: mean power within
``power_tolerance`` and mean SM clock within ``clock_tolerance`` (relative). Under a
cap the controller cycles the clock by a few per cent about once a second, so
quarter-second slices at different phases disagree at a steady point: a slice and the
one a cycle before it (the same phase), or the means of the last two cycles, agreeing
settle it too. Slices whose SM clock sits at the board's maximum are steady whatever
their power: no cap holds the clock, so no transition is under way.
``max_seconds`` bounds the wait; a point that never settles is still measured, and
says so (``settle_steady: false``).

Pure Python (no torch). The simulated executor runs :func:`wait_steady`'s slices on the simulated
GPU; the probe child judges its measured windows themselves with :func:`steady` and
:func:`at_max_clock` (``probe_child/harness.py``, ``_Settle``: a window is one controller cycle, so
two steady windows agree), and sets aside those before the point is steady.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_steady", "steady", "at_max_clock"]

#: One slice of load between two readings, seconds.
SLICE_SECONDS = 0.25
POWER_TOLERANCE = 0.02
CLOCK_TOLERANCE = 0.01
#: The power controller's cycle under a cap (about 1 s on H100: benchmarks/clock_trace.py).
CYCLE_SECONDS = 1.0

Reading = tuple[float | None, float | None]


def at_max_clock(a: Reading, b: Reading, max_clock: float | None) -> bool:
    """Both readings' SM clock at the board's maximum (within half the clock tolerance): no cap holds
    the clock down, so no power transition is under way whatever the power readings say (a workload
    whose iterations alternate heavy and light phases, like an LLM's prefill and decode, moves its
    quarter-second power by more than 2 % at a steady point; the windows' energy counter measures it)."""
    if not max_clock or a[1] is None or b[1] is None:
        return False
    return min(a[1], b[1]) >= max_clock * (1 - CLOCK_TOLERANCE / 2)


def steady(a: Reading, b: Reading, power_tolerance: float = POWER_TOLERANCE,
           clock_tolerance: float = CLOCK_TOLERANCE) -> bool:
    """True when two (power W, SM clock Hz) readings agree within the tolerances.

    A quantity missing from either reading is not compared; with both missing the
    readings say nothing and are not steady.
    """
    compared = False
    for x, y, tolerance in ((a[0], b[0], power_tolerance), (a[1], b[1], clock_tolerance)):
        if x is None or y is None:
            continue
        compared = True
        if abs(x - y) > tolerance * max(abs(x), abs(y), 1e-9):
            return False
    return compared


def wait_steady(
    sample: Callable[[float], Reading],
    max_seconds: float,
    slice_seconds: float = SLICE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    cycle_seconds: float = CYCLE_SECONDS,
    max_clock: float | None = None,
) -> tuple[float, bool | None]:
    """Run ``sample(seconds)`` (load for that long, return mean power and SM clock) until two
    consecutive slices are :func:`steady` or both :func:`at_max_clock` (``max_clock``: the board's
    maximum SM clock, Hz), or a slice and the one ``cycle_seconds`` before it are, or the means of
    the last two ``cycle_seconds`` of slices are, or ``max_seconds`` have passed.

    Returns (seconds waited, steady); steady is None when the samples carry no power and
    no clock at all (no telemetry): there is nothing to wait for, and the wait ends at once.
    """
    start = clock()
    readings: list[Reading] = []
    per_cycle = max(1, round(cycle_seconds / slice_seconds))
    while True:
        left = max_seconds - (clock() - start)
        if left <= 0:
            return clock() - start, False
        reading = sample(min(slice_seconds, left))
        if reading == (None, None):
            return clock() - start, None
        readings.append(reading)
        if len(readings) >= 2 and (steady(readings[-2], reading) or at_max_clock(readings[-2], reading, max_clock)):
            return clock() - start, True
        # Under a power cap the controller cycles the clock (about 1 s): two slices at different
        # phases disagree however steady the point is; a slice and the one a cycle before it (the
        # same phase), or two whole cycles, agree once it is.
        if len(readings) > per_cycle and steady(readings[-1 - per_cycle], reading):
            return clock() - start, True
        if len(readings) >= 2 * per_cycle and steady(_mean(readings[-2 * per_cycle:-per_cycle]),
                                                     _mean(readings[-per_cycle:])):
            return clock() - start, True


def _mean(readings: list[Reading]) -> Reading:
    """Mean power and mean clock of several slices (a quantity missing from any slice: None)."""
    out: list[float | None] = []
    for i in (0, 1):
        values = [r[i] for r in readings]
        out.append(None if any(v is None for v in values) else sum(values) / len(values))  # type: ignore[misc]
    return out[0], out[1]

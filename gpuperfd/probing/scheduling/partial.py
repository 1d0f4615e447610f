"""Sweeps on busy GPUs, taken in parts (issue 50): a sweep needs minutes, a busy GPU's gaps are seconds
to minutes, so a sweep that gave way to a user's job keeps the points it measured and the next gap
measures only the caps left.

Every part is a whole owned sweep of its own (:func:`gpuperfd.probing.sweep.owned.run_owned_sweep`):
the cap set, the point measured, the operator's cap back, the power-cap journal and apply mode's
rules, every time. The parts join into one sweep only when they agree on the GPU (its UUID), the
driver, the probe build (gpuperfd's version and the schedule's probe, preset and options) and the
temperature band (:data:`TEMPERATURE_BAND_CELSIUS`), and only while fresh (the first part no older
than the schedule's interval); otherwise the parts are dropped and the whole sweep is due again. A
sweep is recommended only when joined whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import gpuperfd
from gpuperfd.config import ScheduleConfig
from gpuperfd.device.base import GpuInfo
from gpuperfd.probe_data.recommend import SweepPoint

__all__ = ["Partial", "PartialSweeps", "TEMPERATURE_BAND_CELSIUS", "band_of", "build_of"]

#: Points whose hottest reading falls in one band of this many degrees were taken at one temperature.
TEMPERATURE_BAND_CELSIUS = 10.0


def build_of(schedule: ScheduleConfig) -> str:
    """What the probe's measurement depends on besides the GPU: gpuperfd's version, probe, preset, options."""
    options = ",".join(f"{k}={schedule.options[k]!r}" for k in sorted(schedule.options))
    return f"{gpuperfd.__version__}:{schedule.probe}:{schedule.preset or ''}:{options}"


def band_of(points: Sequence[SweepPoint]) -> int | None:
    """The temperature band all ``points`` share; None if they do not (or none says its temperature)."""
    bands = {int(p.result.temperature_celsius_max // TEMPERATURE_BAND_CELSIUS)
             for p in points if p.result.temperature_celsius_max is not None}
    return bands.pop() if len(bands) == 1 else None


@dataclass(frozen=True)
class Partial:
    """The ok points a sweep measured before it gave way, and what they must agree with to join."""

    points: tuple[SweepPoint, ...]
    caps_watts: tuple[float, ...]  # the whole sweep's caps, in order
    identity: tuple[str, str, str]  # GPU UUID, driver version, probe build
    band: int
    started: float  # wall time the first part began (its first point's start)

    def remaining(self) -> list[float]:
        done = {round(p.cap_watts) for p in self.points}
        return [watts for watts in self.caps_watts if round(watts) not in done]


class PartialSweeps:
    """The sweeps in parts, by (job, gpu); thread-safe."""

    def __init__(self) -> None:
        self._parts: dict[tuple[str, int], Partial] = {}
        self._lock = threading.Lock()

    def keep(self, key: tuple[str, int], info: GpuInfo, schedule: ScheduleConfig, points: Sequence[SweepPoint],
             caps_watts: Sequence[float]) -> Partial | None:
        """A sweep of ``caps_watts`` gave way after ``points``: keep its ok points (joined to an earlier part
        that agrees). None when there is nothing to keep (a single cap, no ok point, or points that do not agree)."""
        ok = tuple(p for p in points if p.result.status == "ok")
        with self._lock:
            before = self._parts.pop(key, None)
            if len(caps_watts) < 2 or not ok:
                return None
            identity = (info.uuid, info.driver_version, build_of(schedule))
            if before is not None and before.identity == identity and tuple(caps_watts) == before.caps_watts:
                ok, started = before.points + ok, before.started
            else:
                started = min(p.result.started_at for p in ok)
            band = band_of(ok)
            if band is None:
                return None
            self._parts[key] = part = Partial(ok, tuple(caps_watts), identity, band, started)
            return part

    def resumable(self, key: tuple[str, int], info: GpuInfo, schedule: ScheduleConfig, max_age: float,
                  now: float | None = None) -> Partial | None:
        """The part to go on from, if it still agrees with the GPU and build and is fresh; else it is dropped."""
        now = time.time() if now is None else now
        with self._lock:
            part = self._parts.get(key)
            if part is None:
                return None
            if part.identity != (info.uuid, info.driver_version, build_of(schedule)) or now - part.started > max_age:
                del self._parts[key]
                return None
            return part

    def join(self, key: tuple[str, int], points: Sequence[SweepPoint]) -> tuple[tuple[SweepPoint, ...] | None, str]:
        """The whole sweep, the kept part's points and ``points`` (the part that measured the rest), if they
        agree on the temperature band and cover every cap; the part is dropped either way. (None, why) if not."""
        with self._lock:
            part = self._parts.pop(key, None)
        if part is None:
            return None, "no earlier part"
        ok = tuple(p for p in points if p.result.status == "ok")
        joined = part.points + ok
        if band_of(joined) != part.band:
            return None, (f"the parts were measured in different temperature bands ({TEMPERATURE_BAND_CELSIUS:g} C): "
                          "not joined")
        missing = {round(w) for w in part.caps_watts} - {round(p.cap_watts) for p in joined}
        if missing:
            return None, f"caps {sorted(missing)} W not measured: not joined"
        order = {round(w): i for i, w in enumerate(part.caps_watts)}
        return tuple(sorted(joined, key=lambda p: order.get(round(p.cap_watts), len(order)))), "joined"

    def drop(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._parts.pop(key, None)

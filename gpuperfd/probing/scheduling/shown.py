"""What the landing page and ``/api/v1/gpus`` show of the probes: the latest ok point per cap, and
the sweep now holding a cap on each GPU.

Its own object (thread-safe), so the sweep observer of every round writes it through declared
methods and the readers (web, ``gpuperfd top``) take copies, none of them reaching into the service.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from gpuperfd.probe_data.progress import SweepProgress
from gpuperfd.probe_data.recommend import SweepPoint

__all__ = ["ShownPoints"]

#: (gpu index, probe, preset)
Key = tuple[int, str, str]


class ShownPoints:
    """The latest ok point per (gpu, probe, preset) and cap, and the sweep in progress per GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[Key, dict[float, SweepPoint]] = {}
        self._sweeps: dict[int, SweepProgress] = {}

    def latest(self) -> dict[Key, list[SweepPoint]]:
        """The latest ok point at each cap, per (gpu, probe, preset), highest cap first."""
        with self._lock:
            return {key: sorted(points.values(), key=lambda p: -p.cap_watts) for key, points in self._latest.items()}

    def sweeps(self) -> dict[int, SweepProgress]:
        """The sweeps holding a cap they set now, by GPU index (a copy)."""
        with self._lock:
            return dict(self._sweeps)

    def put(self, key: Key, point: SweepPoint) -> None:
        """A sweep's point: an ok one is its cap's latest; a failed one is no candidate, so its cap's last
        ok result goes too; a preemption measured nothing (the last ok result stands). An aborted or
        preempted point marks its sweep's points cut short: they recommend nothing now."""
        result = point.result
        with self._lock:
            points = self._latest.setdefault(key, {})
            if result.status == "ok":
                points[round(point.cap_watts)] = point
            elif not result.preempted:
                points.pop(round(point.cap_watts), None)
            if result.status == "aborted" or result.preempted:
                for cap, held in points.items():
                    if held.sweep_id == point.sweep_id:
                        points[cap] = dataclasses.replace(held, sweep_cut_short=True)

    def track(self, key: Key, watts: float | None, caps: Sequence[float]) -> None:
        """The GPU's sweep-in-progress entry: set while a sweep of ``caps`` holds ``watts`` (None: it
        holds none of its own now); point k of n is the cap's place in ``caps``."""
        gpu, probe, preset = key
        with self._lock:
            if watts is None:
                self._sweeps.pop(gpu, None)
                return
            place = next((i for i, cap in enumerate(caps) if round(cap) == round(watts)), None)
            before = self._sweeps.get(gpu)
            point = place + 1 if place is not None else (before.point + 1 if before is not None else 1)
            self._sweeps[gpu] = SweepProgress(gpu, probe, preset, watts, point, max(len(caps), point), time.time())

    def withdraw(self, keep: Callable[[int, str, str, float], bool]) -> None:
        """Drop every point whose (gpu, probe, preset, cap watts) ``keep`` refuses (a reload's caps)."""
        with self._lock:
            for (gpu, probe, preset), points in self._latest.items():
                for watts in [w for w in points if not keep(gpu, probe, preset, w)]:
                    del points[watts]

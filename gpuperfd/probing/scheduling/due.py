"""Which probe results are due, and when each GPU may take one: freshness, not firing times (issue 50).

A schedule's interval is how old its result may get. Its job firing (APScheduler, in
:mod:`gpuperfd.probing.scheduling.scheduler`) only says "this result is due now"; the run then takes the first
moment its GPU qualifies. :class:`DueRuns` keeps the due results (one per schedule job and GPU) until
a run completes them, and :class:`Qualifying` says from when a GPU may be probed: it qualifies once
idle (not allocated, no foreign process, low utilization) for ``probes.idle_seconds``, and a run
starts a random ``0..jitter_seconds`` after that moment, drawn anew each time the GPU qualifies, so a
node's GPUs freed together are not probed in lockstep. A cron schedule's firing opens a window: its
entry expires when the window closes.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuperfd.config import ScheduleConfig

__all__ = ["Due", "DueRuns", "Qualifying"]


@dataclass
class Due:
    """One due result: a schedule's job on one GPU."""

    job_id: str
    schedule: ScheduleConfig
    gpu: int
    group: list[int]  # the job's GPUs (a serial node's job holds several)
    since: float  # wall time it fell due
    until: float | None = None  # wall time a cron window closes (None: due until a run completes it)


class DueRuns:
    """The due results, by (job, GPU); thread-safe. Most overdue first in :meth:`ordered`."""

    def __init__(self) -> None:
        self._due: dict[tuple[str, int], Due] = {}
        self._lock = threading.Lock()

    def fall_due(self, entry: Due) -> bool:
        """Mark ``entry`` due (kept as it was if already due, with the schedule now configured); True if new."""
        with self._lock:
            key = (entry.job_id, entry.gpu)
            known = self._due.get(key)
            if known is not None:
                known.schedule, known.group = entry.schedule, entry.group
                return False
            self._due[key] = entry
            return True

    def get(self, job_id: str, gpu: int) -> Due | None:
        with self._lock:
            return self._due.get((job_id, gpu))

    def done(self, job_id: str, gpu: int) -> Due | None:
        """A run completed it (or a reload removed its job): no longer due; the entry, if it was."""
        with self._lock:
            return self._due.pop((job_id, gpu), None)

    def ordered(self) -> list[Due]:
        """Every due entry, the longest due first."""
        with self._lock:
            return sorted(self._due.values(), key=lambda d: d.since)

    def expired(self, now: float) -> list[Due]:
        """Remove and return the entries whose cron window closed by ``now`` (wall time)."""
        with self._lock:
            gone = [d for d in self._due.values() if d.until is not None and now > d.until]
            for entry in gone:
                del self._due[(entry.job_id, entry.gpu)]
            return gone

    def retain(self, keep: Callable[[str, int], bool]) -> list[Due]:
        """Drop the entries ``keep(job_id, gpu)`` refuses (jobs a reload removed); returns them."""
        with self._lock:
            gone = [d for key, d in self._due.items() if not keep(*key)]
            for entry in gone:
                del self._due[(entry.job_id, entry.gpu)]
            return gone


class Qualifying:
    """From when each GPU may take a due probe: its qualifying moment plus a jitter drawn for that moment.

    ``idle_for(gpu)`` is the idle tracker's (seconds idle, on the ``clock`` the tracker reads). The
    qualifying moment of an idle GPU is ``now - idle_for + idle_seconds``; while it stays the same
    moment (the GPU stays idle) the draw is kept.
    """

    def __init__(self, idle_for: Callable[[int], float], clock: Callable[[], float],
                 rng: random.Random | None = None, handed: Callable[[int], float | None] | None = None) -> None:
        self.idle_for, self.clock = idle_for, clock
        #: When the scheduler handed the GPU over as free (None: not, or busy since): it qualifies then.
        self.handed = handed or (lambda gpu: None)
        self._rng = rng or random.Random()
        self._draws: dict[int, tuple[float, float]] = {}  # gpu -> (qualifying moment, jitter)
        self._lock = threading.Lock()

    def moment(self, gpu: int, idle_seconds: float, now: float | None = None) -> float | None:
        """The GPU's qualifying moment (on ``clock``), or None while it is not idle long enough."""
        now = self.clock() if now is None else now
        idle = self.idle_for(gpu)
        if idle < idle_seconds:
            return self.handed(gpu)
        return now - idle + idle_seconds

    def start_at(self, gpu: int, idle_seconds: float, jitter_seconds: float, now: float | None = None) -> float | None:
        """When a due probe may start on ``gpu`` (qualifying moment plus its jitter), or None: not qualifying."""
        now = self.clock() if now is None else now
        moment = self.moment(gpu, idle_seconds, now)
        if moment is None:
            return None
        with self._lock:
            drawn = self._draws.get(gpu)
            if drawn is None or abs(drawn[0] - moment) > 0.01:  # a new qualifying moment: a new draw
                drawn = (moment, self._rng.uniform(0.0, jitter_seconds) if jitter_seconds > 0 else 0.0)
                self._draws[gpu] = drawn
        return moment + min(drawn[1], jitter_seconds)

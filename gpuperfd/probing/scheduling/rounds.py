"""Probe rounds: the schedules of one GPU that share one probe child.

torch's import and the CUDA context cost a probe child seconds to tens of seconds on a real card
(docs/benchmarks.md, "The first point of a sweep"), so the daemon runs the schedules due on a GPU
in one child. A round starts when a scheduled run gets its GPU and passes the GPU's checks (the
leader). With ``probes.round_window_seconds`` > 0 other schedules of that GPU join it: those the
scheduler finds due within the window (:class:`RoundSource` claims them and moves their next run),
and runs that fire and queue on the GPU while the round runs. A run whose schedule is in, or was
served by, a round that started after it queued returns at once instead of running it again.

:class:`GpuRounds` is that bookkeeping for one GPU; the probe service holds one per GPU and runs
the round (:meth:`gpuperfd.probing.scheduling.service.ProbeService.run`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from enum import Enum
from typing import Protocol

from gpuperfd.config import ScheduleConfig

__all__ = ["GpuRounds", "RoundSource", "Turn"]


class RoundSource(Protocol):
    """The scheduler's side of a round: which other schedules are due, and what they are now."""

    def claim(self, gpu: int, exclude: Collection[str]) -> list[tuple[str, ScheduleConfig]]:
        """The (key, schedule) pairs due on ``gpu`` within the window, their next runs moved past this one."""

    def claimed(self) -> list[tuple[str, ScheduleConfig]]:
        """What this firing claimed so far (a serial node's job covers several GPUs)."""

    def current(self, key: str) -> ScheduleConfig | None:
        """``key``'s schedule as configured now (a reload may have changed it); None: no longer scheduled."""


class Turn(str, Enum):
    """What a run waiting for its GPU got."""

    RUN = "run"  # the GPU's lock: run (and lead a round)
    SERVED = "served"  # its schedule is in, or was served by, a round that started after it queued
    TIMEOUT = "timeout"  # queue_seconds passed


class GpuRounds:
    """One GPU's round bookkeeping: queued runs, the running round's members, who was served.

    Every method is thread-safe. The GPU's lock itself stays the caller's (``threading.Lock``):
    :meth:`wait_turn` takes it, :meth:`release` gives it back and wakes the queue.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._started = 0  # rounds started on this GPU
        self._members: dict[str, str] | None = None  # key -> probe, of the running round
        self._served: dict[str, int] = {}  # key -> the last round that ran it
        self._waiting: dict[str, ScheduleConfig] = {}  # runs queued on the lock, by key
        self.leader = ""  # the running round's first probe, for log lines

    def wait_turn(self, key: str, schedule: ScheduleConfig, lock: threading.Lock, timeout: float,
                  joinable: bool) -> Turn:
        """Wait (at most ``timeout`` s) for ``lock``, or for a round to serve ``key``.

        ``joinable``: a running round may take this run in (its schedule then runs in that
        round's child); otherwise it only queues for the lock, as before rounds existed.
        """
        with self._cond:
            # The first round that can serve this run: the running one (it may still take it), else the next.
            first = self._started if self._members is not None else self._started + 1
            if joinable:
                self._waiting[key] = schedule
            deadline = time.monotonic() + timeout
            try:
                while True:
                    if joinable and self._served_since(key, first):
                        return Turn.SERVED
                    if lock.acquire(blocking=False):
                        return Turn.RUN
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return Turn.TIMEOUT
                    self._cond.wait(remaining)
            finally:
                if self._waiting.get(key) is schedule:
                    del self._waiting[key]

    def _served_since(self, key: str, first: int) -> bool:
        return (self._members is not None and key in self._members) or self._served.get(key, 0) >= first

    def open(self, key: str, probe: str) -> None:
        """A round starts on this GPU (the caller holds its lock and ran the GPU's checks)."""
        with self._cond:
            self._started += 1
            self._members = {key: probe}
            self.leader = probe

    def add(self, members: list[tuple[str, ScheduleConfig]]) -> None:
        """Members the scheduler claimed: their own jobs, should they fire now, are served."""
        with self._cond:
            assert self._members is not None
            for key, schedule in members:
                self._members[key] = schedule.probe
            self._cond.notify_all()

    def take_waiting(self) -> list[tuple[str, ScheduleConfig]]:
        """The runs queued on the GPU now: they join the round (their waits return SERVED)."""
        with self._cond:
            assert self._members is not None
            taken = [(key, schedule) for key, schedule in self._waiting.items() if key not in self._members]
            for key, schedule in taken:
                self._members[key] = schedule.probe
            if taken:
                self._cond.notify_all()
            return taken

    def close(self) -> None:
        """The round ended (before the lock is released): its members count as served by it."""
        with self._cond:
            for key in self._members or {}:
                self._served[key] = self._started
            self._members = None
            self._cond.notify_all()

    def release(self, lock: threading.Lock) -> None:
        """Give the GPU's lock back and wake the runs queued for it."""
        with self._cond:
            lock.release()
            self._cond.notify_all()

"""Probe rounds: the schedules of one GPU that share one probe child.

torch's import and the CUDA context cost a probe child seconds to tens of seconds on a real card
(docs/benchmarks.md, "The first point of a sweep"), so the daemon runs the schedules due on a GPU
in one child. A round starts when a scheduled run gets its GPU and passes the GPU's checks (the
leader). With ``probes.round_window_seconds`` > 0 other schedules of that GPU join it: those the
scheduler finds due within the window (:class:`RoundSource` claims them and moves their next run),
and runs that fire and queue on the GPU while the round runs. A run whose schedule is in, or was
served by, a round that started after it queued returns at once instead of running it again.

:class:`GpuRounds` is that bookkeeping for one GPU; the probe service holds one per GPU and runs
the round (:meth:`gpuperfd.probing.scheduling.service.ProbeService.run`). The GPU's turn itself is
:class:`~gpuperfd.probing.gates.turns.GpuTurns`'s: a queued run waits there, and its wait ends as
served once :meth:`GpuRounds.served_since` says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Protocol

from gpuperfd.config import ScheduleConfig

__all__ = ["GpuRounds", "RoundSource"]


class RoundSource(Protocol):
    """The scheduler's side of a round: which other schedules are due, and what they are now."""

    def claim(self, gpu: int, exclude: Collection[str]) -> list[tuple[str, ScheduleConfig]]:
        """The (key, schedule) pairs due on ``gpu`` within the window, their next runs moved past this one
        (not those in ``exclude``). Asked when the round begins and again when its members are done: a
        schedule that fell due meanwhile runs in the round's child, not in a child of its own started late."""

    def claimed(self) -> list[tuple[str, ScheduleConfig]]:
        """What this firing claimed so far (a serial node's job covers several GPUs)."""

    def current(self, key: str) -> ScheduleConfig | None:
        """``key``'s schedule as configured now (a reload may have changed it); None: no longer scheduled."""


class GpuRounds:
    """One GPU's round bookkeeping: queued runs, the running round's members, who was served.

    Every method is thread-safe; ``changed`` is called (outside its lock) whenever a queued run may
    have been served, so the GPU's turn queue looks again (:meth:`GpuTurns.nudge`).
    """

    def __init__(self, changed: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._changed = changed
        self._started = 0  # rounds started on this GPU
        self._members: dict[str, str] | None = None  # key -> probe, of the running round
        self._served: dict[str, int] = {}  # key -> the last round that ran it
        self._waiting: dict[str, ScheduleConfig] = {}  # runs queued for the GPU's turn, by key
        self.leader = ""  # the running round's first probe, for log lines

    def queue(self, key: str, schedule: ScheduleConfig) -> int:
        """A run queues for the GPU's turn (a running round may take it in); returns the first round
        that can serve it: the running one (it may still take it), else the next."""
        with self._lock:
            self._waiting[key] = schedule
            return self._started if self._members is not None else self._started + 1

    def unqueue(self, key: str, schedule: ScheduleConfig) -> None:
        """The run's wait for the GPU's turn ended (granted, served or timed out)."""
        with self._lock:
            if self._waiting.get(key) is schedule:
                del self._waiting[key]

    def served_since(self, key: str, first: int) -> bool:
        """Whether ``key`` is in the running round or was run by round ``first`` or a later one."""
        with self._lock:
            return (self._members is not None and key in self._members) or self._served.get(key, 0) >= first

    def open(self, key: str, probe: str) -> None:
        """A round starts on this GPU (the caller holds the GPU's turn and ran its checks)."""
        with self._lock:
            self._started += 1
            self._members = {key: probe}
            self.leader = probe

    def add(self, members: list[tuple[str, ScheduleConfig]]) -> None:
        """Members the scheduler claimed: their own jobs, should they fire now, are served."""
        with self._lock:
            assert self._members is not None
            for key, schedule in members:
                self._members[key] = schedule.probe
        self._changed()

    def take_waiting(self) -> list[tuple[str, ScheduleConfig]]:
        """The runs queued on the GPU now: they join the round (their waits return SERVED)."""
        with self._lock:
            assert self._members is not None
            taken = [(key, schedule) for key, schedule in self._waiting.items() if key not in self._members]
            for key, schedule in taken:
                self._members[key] = schedule.probe
        if taken:
            self._changed()
        return taken

    def close(self) -> None:
        """The round ended (before the GPU's turn is given back): its members count as served by it."""
        with self._lock:
            for key in self._members or {}:
                self._served[key] = self._started
            self._members = None
        self._changed()

"""A simulated probe child: the imports a real child makes before its build, as time (issue 60).

The simulator measures in this process, so it has no child to start; but a real probe's spawn and
imports (3.7-15.4 s on an H200, :mod:`~gpuperfd.probing.simulated.costs`) are most of its time from
the qualifying moment, and a standby child (:mod:`gpuperfd.probing.child.standby`) exists to pay them
before it. This stands for that child: its imports are a span of time from ``start`` (on the CPU:
nothing on the GPU, so a user's job sees nothing of it), and a session that takes it pays only what
is left of them (none once it is ready). It speaks the part of :class:`~gpuperfd.probing.child.runner.ProbeChild`
that :class:`~gpuperfd.probing.child.standby.StandbyChildren` uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuperfd.device.base import Device
from gpuperfd.probe_data.request import ProbeRequest

__all__ = ["SimulatedChild", "pass_time"]

#: How often a simulated wait looks at its stop condition.
TICK_SECONDS = 0.02


@dataclass(frozen=True)
class _Spec:
    probe: str


def pass_time(seconds: float, stop: Callable[[], str | None]) -> str | None:
    """Let ``seconds`` pass, asking ``stop`` every tick; its first answer that is not None, or None."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if (why := stop()) is not None:
            return why
        time.sleep(min(left, TICK_SECONDS))
    return stop()


class SimulatedChild:
    """A simulated child for one probe: imports for ``imports_seconds`` from its start, then ready until
    closed. It starts at once (``starts_at_once``: no process, so no thread waits for it); whoever takes
    it pays what is left of the imports (:meth:`remaining_seconds`)."""

    starts_at_once = True

    def __init__(self, device: Device, request: ProbeRequest, imports_seconds: float) -> None:
        self.spec = _Spec(request.probe)
        self.request = request
        self.imports_seconds = imports_seconds
        #: The GPU it is started for, and the processes that are ours there (set when a round takes it).
        self.device: Device | None = device
        self.own: set[int] = set()
        self.should_abort: Callable[[], bool] | None = None
        self.pid: int | None = None  # no process: nothing of it is ever on a GPU
        self._ready_at: float | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def built(self) -> bool:
        return False

    @property
    def ready(self) -> bool:
        return self.alive and self.remaining_seconds() <= 0

    def start(self, deadline: float, defer_build: bool = True) -> None:
        """Its imports begin now (they take ``imports_seconds``); returns at once."""
        self._ready_at = time.monotonic() + self.imports_seconds
        return None

    def remaining_seconds(self) -> float:
        """What is left of its imports (all of them before :meth:`start`)."""
        if self._ready_at is None:
            return self.imports_seconds
        return max(0.0, self._ready_at - time.monotonic())

    def close(self) -> None:
        self._closed = True

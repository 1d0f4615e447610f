"""A simulated probe child: the imports a real child makes before its build, as time (issue 60).

The simulator measures in this process, so it has no child to start; but a real probe's spawn and
imports (3.7-15.4 s on an H200, :mod:`~gpuperfd.probing.simulated.costs`) are most of its time from
the qualifying moment, and a standby child (:mod:`gpuperfd.probing.child.standby`) exists to pay them
before it. This stands for that child: ``start`` takes the imports' time (on the CPU: nothing on the
GPU, so a user's job sees nothing of it), ends at once when told to, and a session that takes it
ready charges no imports. It speaks the part of :class:`~gpuperfd.probing.child.runner.ProbeChild`
that :class:`~gpuperfd.probing.child.standby.StandbyChildren` uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuperfd.device.base import Device
from gpuperfd.probe_data.request import ProbeRequest

__all__ = ["SimulatedChild", "NotReady", "pass_time"]

#: How often a simulated wait looks at its stop condition.
TICK_SECONDS = 0.02


@dataclass(frozen=True)
class _Spec:
    probe: str


@dataclass(frozen=True)
class NotReady:
    """Why a simulated child's start ended before it was ready."""

    error_message: str


def pass_time(seconds: float, stop: Callable[[], str | None]) -> str | None:
    """Let ``seconds`` pass, asking ``stop`` every tick; its first answer that is not None, or None."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if (why := stop()) is not None:
            return why
        time.sleep(min(left, TICK_SECONDS))
    return stop()


class SimulatedChild:
    """A simulated child for one probe: imports for ``imports_seconds``, then ready until closed."""

    def __init__(self, device: Device, request: ProbeRequest, imports_seconds: float) -> None:
        self.spec = _Spec(request.probe)
        self.request = request
        self.imports_seconds = imports_seconds
        #: The GPU it is started for, and the processes that are ours there (set when a round takes it).
        self.device: Device | None = device
        self.own: set[int] = set()
        self.should_abort: Callable[[], bool] | None = None
        self.pid: int | None = None  # no process: nothing of it is ever on a GPU
        self.ready = False
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def built(self) -> bool:
        return False

    def start(self, deadline: float, defer_build: bool = True) -> NotReady | None:
        """The imports' time; ended early by ``should_abort`` or :meth:`close` (then not ready)."""
        def stop() -> str | None:
            if self._closed or (self.should_abort is not None and self.should_abort()):
                return "ended before its imports were done"
            return "did not finish its imports in time" if time.monotonic() >= deadline else None

        why = pass_time(self.imports_seconds, stop)
        if why is not None:
            self._closed = True
            return NotReady(f"simulated probe child {why}")
        self.ready = True
        return None

    def close(self) -> None:
        self._closed = True

"""One caller inside a GPU library at a time: the serialization point of the device layer.

Why: libnvidia-ml 580.159.04 crashed (SIGSEGV) when two threads of one process made their
first GPM round on two GPUs at once (35-38 of 40 fresh processes on a 2x H200 node; 0 of 40
with one lock; ``benchmarks/nvml_thread_race.py``), and ``gpuperfd check`` died in 13 of 23
runs that way. NVIDIA documents NVML as thread-safe; we do not rely on it. Every library call
of every thread of the process (sampler lanes, XID polls, busy checks, cap changes, the probe
child's window sampler) enters through one :class:`CallGate`, so the process never has two
threads inside the library at once, whatever the driver version does. The lock stays even if
NVIDIA fixes the race: the calls are microseconds (a PCIe throughput read, the slowest, 21 ms),
the daemon makes a few hundred a second on 8 GPUs, and a crash takes the node's telemetry down.

A hung call must not blind the node: a caller that has waited until the call inside has run for
``hang_seconds`` (``device.call_timeout_seconds``) sets that call aside as hung and goes in.
The hung thread is still inside the library (nothing can pull it out), so from then on the
process may have two threads inside: the one stuck and the one working. A call about the hung
call's GPU (its scope) waits for that call to return, out of the queue so the other GPUs' calls
go on, for at most ``hang_seconds``, then is refused with :class:`DeviceTimeout`: a slow call that
does come back (a cap restore behind it) loses nothing, a lost GPU stops its own readings and
nobody else's, and the node waits at most ``hang_seconds`` once per hung call.

The same thread entering twice would deadlock: it raises instead (a bug in the caller).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gpuperfd.device.errors import DeviceTimeout

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A call's scope: a GPU index, or None for a node-level call (init, device count, XID events).
Scope = int | None


@dataclass
class _Entry:
    scope: Scope
    name: str
    thread: int
    started: float


@dataclass
class GateStats:
    """What the serialization cost, cumulative since the gate was made (all plain numbers)."""

    calls: int = 0
    #: Calls that found another call inside and waited, and the seconds they waited in all.
    waited: int = 0
    wait_seconds: float = 0.0
    max_wait_seconds: float = 0.0
    #: Seconds some call was inside the library (the gate's busy time).
    inside_seconds: float = 0.0
    #: Calls set aside as hung, and calls refused because their GPU had a hung call.
    set_aside: int = 0
    refused: int = 0
    #: Most threads ever inside at once (1 unless a call was set aside as hung).
    max_inside: int = 0
    #: Hung calls still inside now, by scope.
    hung_now: dict[str, float] = field(default_factory=dict)


class CallGate:
    """Lets one thread at a time into a library; see the module docstring for hangs."""

    def __init__(self, library: str, hang_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.library = library
        self.hang_seconds = hang_seconds
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._inside: _Entry | None = None
        self._hung: list[_Entry] = []
        #: Callers waiting, in arrival order (tickets); the first goes in when the library is free.
        self._queue: deque[object] = deque()
        self._stats = GateStats()

    def stats(self) -> GateStats:
        """A copy of the counters, with the hung calls still inside."""
        with self._cond:
            now = self._clock()
            copy = GateStats(**{k: v for k, v in vars(self._stats).items() if k != "hung_now"})
            copy.hung_now = {f"{e.scope}:{e.name}": now - e.started for e in self._hung}
            return copy

    def call(self, scope: Scope, name: str, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` with no other thread inside (but a hung one); ``name`` is for messages."""
        entry = self._enter(scope, name)
        try:
            return fn(*args)
        finally:
            self._leave(entry)

    def _enter(self, scope: Scope, name: str) -> _Entry:
        """Wait for our turn (first come, first served: a thread calling in a loop cannot starve
        the others), setting a hung call aside when we are next and it has run too long. A call
        whose GPU has a hung call waits for that one out of the queue (the others go on), at most
        ``hang_seconds`` from when it found it hung (it may have queued behind it before), then
        is refused."""
        me = threading.get_ident()
        with self._cond:
            arrived = self._clock()
            ticket = object()
            waited = False
            hung_seen: float | None = None  # when this call found its GPU's call hung
            try:
                while True:
                    if self._hung_call(scope) is not None:
                        if ticket in self._queue:
                            self._queue.remove(ticket)
                            self._cond.notify_all()
                        hung_seen = self._clock() if hung_seen is None else hung_seen
                        remaining = hung_seen + self.hang_seconds - self._clock()
                        if remaining <= 0:
                            self._refuse(scope, name)
                        waited = True
                        self._cond.wait(remaining)
                        continue
                    if ticket not in self._queue:
                        self._queue.append(ticket)
                    current = self._inside
                    if current is not None and current.thread == me:
                        raise RuntimeError(f"{self.library}: {name} called from inside {current.name} (same thread)")
                    if self._queue[0] is ticket:
                        if current is None:
                            break
                        age = self._clock() - current.started
                        if age >= self.hang_seconds:
                            self._set_aside(current, age)
                            continue
                        waited = True
                        self._cond.wait(self.hang_seconds - age)
                    else:
                        waited = True
                        self._cond.wait(self.hang_seconds)
            finally:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                self._cond.notify_all()
            now = self._clock()
            stats = self._stats
            stats.calls += 1
            if waited:
                stats.waited += 1
                stats.wait_seconds += now - arrived
                stats.max_wait_seconds = max(stats.max_wait_seconds, now - arrived)
            self._inside = _Entry(scope, name, me, now)
            stats.max_inside = max(stats.max_inside, 1 + len(self._hung))
            return self._inside

    def _leave(self, entry: _Entry) -> None:
        with self._cond:
            now = self._clock()
            if self._inside is entry:
                self._inside = None
                self._stats.inside_seconds += now - entry.started
            else:  # it had been set aside as hung and came back
                self._hung.remove(entry)
                log.warning("%s: %s (GPU %s) returned after %.1f s; calls to that GPU resume",
                            self.library, entry.name, entry.scope, now - entry.started)
            self._cond.notify_all()

    def _set_aside(self, entry: _Entry, age: float) -> None:
        self._inside = None
        self._hung.append(entry)
        self._stats.set_aside += 1
        log.error("%s: %s (GPU %s) has not returned for %.1f s: treated as hung; other calls go on, "
                  "that GPU gets none until it returns", self.library, entry.name, entry.scope, age)

    def _hung_call(self, scope: Scope) -> _Entry | None:
        return next((hung for hung in self._hung if hung.scope == scope), None)

    def _refuse(self, scope: Scope, name: str) -> None:
        hung = self._hung_call(scope)
        assert hung is not None
        self._stats.refused += 1
        where = "node-level" if scope is None else f"GPU {scope}"
        raise DeviceTimeout(
            f"{where}: {name} not called: an earlier {hung.name} has not returned for "
            f"{self._clock() - hung.started:.1f} s ({self.library} call timeout {self.hang_seconds:g} s)")


class EntryCounter:
    """Counts threads inside a library at once: the simulated GPU's stand-in for libnvidia-ml's crash.

    The real library crashed when two threads entered it together; the simulator (and the tests'
    fake NVML) cannot crash the same way, so they count instead: ``concurrent_entries`` is how
    often a thread came in while another was inside. With the gate in front it stays 0, unless a
    call was set aside as hung (then the stuck thread and the next caller are both inside, as on a
    real node). A call nested in the same thread (a simulated getter using another) is one entry.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._inside = 0
        self.max_inside = 0
        self.concurrent_entries = 0
        self.entries = 0

    def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``fn(*args, **kwargs)``, counted as one entry of this thread into the library."""
        depth = getattr(self._local, "depth", 0)
        if depth:
            return fn(*args, **kwargs)
        with self._lock:
            self._inside += 1
            self.entries += 1
            self.max_inside = max(self.max_inside, self._inside)
            if self._inside > 1:
                self.concurrent_entries += 1
        self._local.depth = 1
        try:
            return fn(*args, **kwargs)
        finally:
            self._local.depth = 0
            with self._lock:
                self._inside -= 1

    def inside_now(self) -> bool:
        """True while this thread is inside (a nested call goes straight in)."""
        return bool(getattr(self._local, "depth", 0))
